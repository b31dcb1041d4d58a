"""The ``pii`` stage: replace e-mail addresses, public IP addresses and (optionally) phone
numbers with placeholder tokens before tokenization.

It runs after decontamination, so eval and validation matching see the original text, and
writes every text it changed to ``overrides/pii/part-*.parquet`` (OVERRIDE_SCHEMA), like
decontamination's ``cut``: ``docs/`` keeps the original, the tokenizer reads the redacted one.

The e-mail and IP patterns are datatrove's PIIFormatter's
(src/datatrove/pipeline/formatters/pii.py), so the same addresses are and are not replaced:
an IP must parse as one (``ipaddress``: octets 0-255, no leading zeros) and, by default, be
public (``is_global``: private, loopback, link-local, reserved and shared ranges stay). Every
match of a kind is replaced by that kind's one placeholder, so the output is a pure function
of the text and the settings (datatrove cycles through several replacements instead).
"""
from __future__ import annotations

import ipaddress
import re

import pyarrow as pa

from .config import PiiConfig
from .documents import OVERRIDE_SCHEMA
from .survivors import Survivors
from .workdir import ParquetPart

STAGE = "pii"
KINDS = ("email", "ip", "phone")

EMAIL = re.compile(
    r"\b[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
    r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|"
    r"[01]?[0-9][0-9]?|[a-z0-9-]*[a-z0-9]:)])", re.IGNORECASE)
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
# An optional +country code, an optional (area code), then 2-4 digit groups joined by one space,
# dash or dot; accepted when it has 10-15 digits (E.164 allows 15) and is not an IP address, so
# dates, years, versions and IP addresses (replaced before, or private and left) do not count.
PHONE = re.compile(r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,5}(?![\w.-]?\w)")


def _ip_ok(s: str, public_only: bool) -> bool:
    try:
        ip = ipaddress.ip_address(s)
    except ValueError:  # e.g. a leading zero ("108.0.0.01") is not an address
        return False
    return ip.is_global or not public_only


def _phone_ok(s: str) -> bool:
    try:
        ipaddress.ip_address(s)  # a private IP the ip step left (192.168.100.100 has 12 digits) is no phone
        return False
    except ValueError:
        return 10 <= sum(c.isdigit() for c in s) <= 15


class Redactor:
    """``redact(text) -> (new text, {kind: replacements})`` for one ``pii`` section."""

    def __init__(self, cfg: PiiConfig):
        # (kind, pattern, validator, placeholder, a substring every match has), in this order: an
        # e-mail's domain may be an IP address, and it goes whole as an e-mail
        self.steps = []
        if cfg.emails:
            self.steps.append(("email", EMAIL, None, cfg.email_token, "@"))
        if cfg.ips:
            self.steps.append(("ip", IPV4, lambda s: _ip_ok(s, cfg.public_ips_only), cfg.ip_token, "."))
        if cfg.phones:
            self.steps.append(("phone", PHONE, _phone_ok, cfg.phone_token, None))

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        counts: dict[str, int] = {}
        for kind, pattern, valid, token, needle in self.steps:
            if needle is not None and needle not in text:  # most documents: no regex pass at all
                continue
            n = 0

            def sub(m: re.Match) -> str:
                nonlocal n
                if valid is not None and not valid(m.group(0)):
                    return m.group(0)
                n += 1
                return token

            text = pattern.sub(sub, text)
            if n:
                counts[kind] = n
        return text, counts


def pii_task(item: dict, cfg: PiiConfig, survivors: Survivors) -> dict:
    """One partition's surviving documents (earlier cuts applied): writes the redacted texts of
    the documents that changed, returns the replacement counts."""
    redactor = Redactor(cfg)
    out = ParquetPart(survivors.wd.overrides(STAGE, item["part"]), OVERRIDE_SCHEMA)
    counts = {k: 0 for k in KINDS}
    docs = changed = 0
    for t in survivors.docs(item["part"], list(OVERRIDE_SCHEMA.names), 4096):
        rows = {k: [] for k in OVERRIDE_SCHEMA.names}
        for i, o, p, text in zip(*(t.column(k).to_pylist() for k in OVERRIDE_SCHEMA.names)):
            docs += 1
            new, c = redactor.redact(text)
            if not c:
                continue
            changed += 1
            for k, v in c.items():
                counts[k] += v
            for k, v in zip(OVERRIDE_SCHEMA.names, (i, o, p, new)):
                rows[k].append(v)
        if rows["id"]:
            out.write(pa.table(rows, schema=OVERRIDE_SCHEMA))
    out.commit()
    return {"documents_in": docs, "documents_changed": changed, "replacements": counts}
