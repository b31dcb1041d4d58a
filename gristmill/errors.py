"""The error family. Every failure that gristmill can explain in one actionable sentence is a
`GristmillError`; the CLI prints those as one line (exit 2) and everything else with its full
traceback, because an unexpected exception is a bug to report, not a message to shorten.

This module imports nothing, so every part (manifests at the bottom of the import graph
included) can raise these without importing the CLI."""
from __future__ import annotations


class GristmillError(Exception):
    """Base of every error gristmill raises on purpose: the message says what is wrong and what to do."""


class UsageError(GristmillError, ValueError):
    """A command line, job file or argument value that cannot be used as given (also a ValueError,
    so library callers that catch bad argument values keep working)."""


class ConfigError(UsageError):
    """A job file (or `--set` override) that does not validate: `section.key: expected ..., got ...`."""
