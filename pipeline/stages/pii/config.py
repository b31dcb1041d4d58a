"""The ``pii`` section of a prepare job (docs/pipeline.md)."""
from __future__ import annotations

from gristmill.config import Bool, Section, Str


class PiiConfig(Section):
    """The ``pii`` stage (its tasks.py, docs/pipeline.md): placeholders for personal data."""

    enabled: Bool = True
    emails: Bool = True
    ips: Bool = True  # IPv4 addresses
    public_ips_only: Bool = True  # leave private, loopback, link-local and reserved addresses (not personal)
    phones: Bool = False  # heuristic (10-15 digits in groups): opt in
    email_token: Str = "<EMAIL>"
    ip_token: Str = "<IP>"
    phone_token: Str = "<PHONE>"
