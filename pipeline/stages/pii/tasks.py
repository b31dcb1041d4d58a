"""The ``pii`` stage: replace e-mail addresses, public IP addresses and (optionally) phone
numbers with placeholder tokens before tokenization.

It runs after decontamination, so eval and validation matching see the original text, and
writes every text it changed to ``overrides/pii/part-*.parquet`` (OVERRIDE_SCHEMA), like
decontamination's ``cut``: ``docs/`` keeps the original, the tokenizer reads the redacted one.

The e-mail pattern is datatrove's PIIFormatter's (src/datatrove/pipeline/formatters/pii.py).
Its IP pattern is the candidate here: a dotted quad must parse as an address (``ipaddress``:
octets 0-255, no leading zeros), by default be public (``is_global``), and, unlike datatrove,
stand in the context of an address (``ip_in_context``, docs/pipeline.md "PII"): section
numbers (``5.2.1.1.`` at the start of a heading), versions (``v1.7.8.2``, ``gcc 2.7.2.3``), OIDs
and pieces of longer dotted numbers are not IP addresses, and on real documentation they were
most of datatrove's replacements (benchmarks/bench_pii.py). Every match of a kind is replaced
by that kind's one placeholder, so the output is a pure function of the text and the settings
(datatrove cycles through several replacements instead).
"""
from __future__ import annotations

import ipaddress
import re

import pyarrow as pa

from ...documents import OVERRIDE_SCHEMA
from ...survivors import Survivors
from .config import PiiConfig

STAGE = "pii"
KINDS = ("email", "ip", "phone")

EMAIL = re.compile(
    r"\b[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
    r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|"
    r"[01]?[0-9][0-9]?|[a-z0-9-]*[a-z0-9]:)])", re.IGNORECASE)
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
# The candidates: datatrove's dotted quad, as group 1; a troff font escape before it (``\f5``, as in
# man page sources) is markup, and its one-character font name is not the quad's first digit.
IP_CANDIDATE = re.compile(r"(?:(?<=\\f)[0-9A-Z](?=\d))?(" + IPV4.pattern + ")")
# An optional +country code, an optional (area code), then 2-4 digit groups joined by one space,
# dash or dot; accepted when it has 10-15 digits (E.164 allows 15) and is not an IP address, so
# dates, years, versions and IP addresses (replaced before, or private and left) do not count.
PHONE = re.compile(r"(?<![\w+.-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,5}(?![\w.-]?\w)")


# -- the context of an address (docs/pipeline.md, "PII") ---------------------------------------
# Glued to a longer token: a letter, digit or '_' right before (v1.2.3.4, 1.2.840.113549.1.1.1),
# or "<digit>." (a longer dotted number); a troff font escape (\f5, \fB) is markup, not a letter.
_GLUED_BEFORE = re.compile(r"(?:(?<!\\)[A-Za-z]|(?<!\\f)[0-9]|_|[0-9]\.)\Z")
# ... or after: a digit, ".<digit>", a letter, "-"/"+" and an alphanumeric (1.2.1.2-2, 1.3.0.1-motley, 2.1.0.6j).
_GLUED_AFTER = re.compile(r"[0-9A-Za-z_]|\.[0-9]|[-+][0-9A-Za-z]")
_VERSION = re.compile(r"(?i)\b(?:v|vers?|versions?|releases?|released|rev|revision|standards|policy|since|fixed in|"
                      r"merged (?:in)?to|changes in|updated?s?|upgraded?s?|patch(?:ed|es)?|bump(?:ed|s)?|sync(?:ed)? with|"
                      r"kernel|linux|gcc|python|section|sect|chapter|clause|table|figure|fig|rfc ?\d*|§)\b[^\n]{0,30}\Z"
                      r"|\bfrom v?\d+(?:\.\d+)+ to\W{0,2}\Z")  # "from 4.4.1 to 4.4.2.2": a version range
_OID = re.compile(r"(?i)\b(?:oids?|asn\.?1|object identifiers?|shortname|extensions?)\b")
_ADDRESS_WORD = re.compile(
    r"(?i)\b(?:ip|ips|ipv4|ip[ _-]?addresse?s?|addr|addresse?s?|hosts?|hostnames?|servers?|dns|nameservers?|gateways?|"
    r"netmasks?|subnets?|routes?|routers?|routing|cidr|peers?|endpoints?|proxy|ping|connect(?:ed|ion)?|local|remote|src|dst|"
    r"sources?|destinations?|interfaces?|bind|listen(?:ing)?|rrdatas?|nat|from|via|resolves?|blocks?|ranges?)\b")
_QUAD = r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}"
_LIST_SEP = r"(?:[ \t]*[,;|][ \t]*|\s+)"
_NEIGHBOUR_AFTER = re.compile(rf"['\"`]?{_LIST_SEP}['\"`]?{_QUAD}(?![\d.]*\.\d)")  # quoted lists too: `1.1.1.1`, `8.8.8.8`
_NEIGHBOUR_BEFORE = re.compile(rf"(?<![\d.]){_QUAD}['\"`]?{_LIST_SEP}['\"`]?\Z")
_SUFFIX = re.compile(r"/(?:3[0-2]|[12]?\d)(?!\d)|:\d{1,5}(?!\d)")  # /24 (CIDR), :8080 (port)
_ADDRESS_BEFORE = re.compile(r"(?:://|[@=:])['\"`\[]?\Z")  # in a URL, after @, key=, or host:/::ffff:
_HEADING_AFTER = re.compile(r"\.(?!\d)|[ \t\u00a0]+\S")


def ip_in_context(text: str, start: int, end: int) -> bool:
    """Whether the dotted quad at ``text[start:end]`` is an IP address by its context. All of:

    1. not glued to a longer token (``v1.2.3.4``, ``1.2.840.113549.1.1.1``, ``1.2.99.905``);
    2. not a version: no version word (version, release, since, update to, ...) shortly before
       it on its line, and no OID word in the 60 characters before;
    3. not a heading or list number: at the start of a line (after markup), followed by ``.``
       or by text (``5.2.1.1. Dipendenze``, ``3.7.91.1 - 2013-03-05``);
    4. in the context of an address, one of: a CIDR ``/n`` or ``:port`` after it; in a URL or
       after ``@``, ``=`` or ``:``; next to another dotted quad in a list; an address word (ip,
       address, host, server, dns, gateway, route, peer, from, ...) in the 60 characters before;
       or octets like an allocated address's (first >= 10 and one >= 100), not a small version's.
    """
    before, after = text[max(0, start - 60):start], text[end:end + 40]
    if _GLUED_BEFORE.search(before) or _GLUED_AFTER.match(after):
        return False
    line = before.rsplit("\n", 1)[-1]
    if _VERSION.search(line) or _OID.search(before):
        return False
    suffix = _SUFFIX.match(after)
    octets = [int(x) for x in text[start:end].split(".")]
    allocated = octets[0] >= 10 and max(octets) >= 100  # like 162.222.181.197, unlike a version's 4.3.0.1
    if not line.strip(" \t*#>-\\&") and not suffix and not allocated and _HEADING_AFTER.match(after):
        return False
    return bool(suffix or allocated or _ADDRESS_BEFORE.search(before) or _NEIGHBOUR_AFTER.match(after)
                or _NEIGHBOUR_BEFORE.search(before) or _ADDRESS_WORD.search(before))


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
        # (kind, pattern, validator of the match, placeholder, a substring every match has), in this order: an
        # e-mail's domain may be an IP address, and it goes whole as an e-mail
        self.steps = []
        if cfg.emails:
            self.steps.append(("email", EMAIL, None, cfg.email_token, "@"))
        if cfg.ips:
            self.steps.append(("ip", IP_CANDIDATE, lambda m: _ip_ok(m.group(1), cfg.public_ips_only)
                               and ip_in_context(m.string, m.start(1), m.end(1)), cfg.ip_token, "."))
        if cfg.phones:
            self.steps.append(("phone", PHONE, lambda m: _phone_ok(m.group(0)), cfg.phone_token, None))

    def redact(self, text: str) -> tuple[str, dict[str, int]]:
        counts: dict[str, int] = {}
        for kind, pattern, valid, token, needle in self.steps:
            if needle is not None and needle not in text:  # most documents: no regex pass at all
                continue
            n = 0

            def sub(m: re.Match) -> str:
                nonlocal n
                if valid is not None and not valid(m):
                    return m.group(0)
                n += 1
                g = m.re.groups and 1  # the part replaced: group 1 where the pattern has one (the IP candidate's quad)
                return m.string[m.start():m.start(g)] + token + m.string[m.end(g):m.end()]

            text = pattern.sub(sub, text)
            if n:
                counts[kind] = n
        return text, counts


def pii_task(item: dict, cfg: PiiConfig, survivors: Survivors) -> dict:
    """One partition's surviving documents (earlier cuts applied): writes the redacted texts of
    the documents that changed, returns the replacement counts."""
    redactor = Redactor(cfg)
    out = survivors.wd.part(survivors.wd.overrides(STAGE, item["part"]), OVERRIDE_SCHEMA)
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
