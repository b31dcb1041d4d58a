"""The error family. Every failure that gristmill can explain in one actionable sentence is a
`GristmillError`; the CLI prints those as one line (exit 2) and everything else with its full
traceback, because an unexpected exception is a bug to report, not a message to shorten.

This module imports nothing of gristmill, so every part (manifests at the bottom of the import
graph included) can raise these without importing the CLI."""
from __future__ import annotations

import errno


class GristmillError(Exception):
    """Base of every error gristmill raises on purpose: the message says what is wrong and what to do."""


class UsageError(GristmillError, ValueError):
    """A command line, job file or argument value that cannot be used as given (also a ValueError,
    so library callers that catch bad argument values keep working)."""


class ConfigError(UsageError):
    """A job file (or `--set` override) that does not validate: `section.key: expected ..., got ...`."""


# Errors of the machine, not of gristmill's code: a full or read-only disk is the operator's to
# fix, so the CLI prints them as one line (exit 2) like a GristmillError.
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}  # no space; over the quota
_READ_ONLY = errno.EROFS


def is_disk_error(e: BaseException) -> bool:
    """True for an OSError that says the disk is full (no space, quota) or read-only."""
    return isinstance(e, OSError) and (e.errno in _DISK_FULL or e.errno == _READ_ONLY)


def os_error_text(e: OSError, fix: str = "") -> str:
    """One line for an OSError: the file it names, the system's words, and what to do about it
    (``fix``, else the usual remedy for a full or read-only disk)."""
    where = " -> ".join(str(f) for f in (e.filename, getattr(e, "filename2", None)) if f is not None)
    if not fix:
        fix = ("free space on that filesystem (or raise the quota), or point the command at another one"
               if e.errno in _DISK_FULL else "that filesystem is read-only: choose a writable place"
               if e.errno == _READ_ONLY else "check the path and its permissions")
    return f"{where + ': ' if where else ''}{e.strerror or e}; {fix}"
