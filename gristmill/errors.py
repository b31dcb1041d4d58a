"""The error family. Every failure that gristmill can explain in one actionable sentence is a
`GristmillError`; the CLI prints those as one line (exit 2) and everything else with its full
traceback, because an unexpected exception is a bug to report, not a message to shorten.

This module imports nothing of gristmill, so every part (manifests at the bottom of the import
graph included) can raise these without importing the CLI."""
from __future__ import annotations

import errno
import functools
import logging
import sys


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


# -- a store's file that fails to close while it is garbage-collected --------------------------------
_OBJECT_STORE_MODULES = ("fsspec", "s3fs", "gcsfs", "adlfs")
_close_noise_log = logging.getLogger("gristmill.close_noise")
_close_noise_log.addHandler(logging.NullHandler())  # outside a task's log, a worker has nowhere else to put it


def store_close_noise_to_the_log(level: int = logging.DEBUG, *, worker: bool = False) -> None:
    """Install ``sys.unraisablehook`` so that an fsspec file (s3fs's upload) failing to close while it is
    garbage-collected, after its store went away, goes to the log at ``level``: Python printed ~30 lines
    (``Exception ignored in AbstractBufferedFile.__del__``) before gristmill's one-line error. Anything
    else unraisable goes to the hook this one replaced.

    The CLI calls it at DEBUG (``-v`` shows it). A worker process of a runner (``worker=True``) calls it
    at the start of each batch at WARNING, so a task's log keeps it (the rest, with no task's log open,
    goes nowhere: never the user's terminal, which a local pool worker shares); it replaces only
    Python's own hook, so the CLI's, or a test session's, stays in a process that runs tasks itself."""
    if worker and sys.unraisablehook is not sys.__unraisablehook__:
        return
    previous = sys.unraisablehook
    if isinstance(previous, functools.partial) and previous.func is _close_noise:
        previous = previous.args[1]  # installed again (another command in this process): never a chain of them
    sys.unraisablehook = functools.partial(_close_noise, level, previous)


def _close_noise(level: int, previous, unraisable) -> None:
    where = getattr(unraisable.object, "__module__", None) or type(unraisable.object).__module__ or ""
    if where.split(".")[0] in _OBJECT_STORE_MODULES:
        _close_noise_log.log(level, "ignored while closing a file of an object store: %s: %s",
                             getattr(unraisable.exc_type, "__name__", "?"), unraisable.exc_value,
                             exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))
        return
    previous(unraisable)
