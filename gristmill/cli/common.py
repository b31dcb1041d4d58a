"""What every command shares: the job-file options (``--set``, ``--print-config``, one
implementation for prepare, train and mix) and the error contract (a ``GristmillError`` is one
line and exit 2; its traceback too under ``-v``; so is a failure of the machine: a full or
read-only disk, an object store that does not answer; anything else is a bug and keeps its
traceback)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from gristmill import config
from gristmill.errors import GristmillError, is_disk_error, os_error_text, store_close_noise_to_the_log


def add_job_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """The job file and its ``--set`` / ``--print-config``, the same on every command that reads one."""
    p.add_argument("job", help=what)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job field (VALUE is YAML), e.g. --set run.steps=10 or --set inputs[0].format=jsonl; repeatable")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved job (every default, overrides applied, paths absolute) as YAML and exit")


def load_job(args: argparse.Namespace, load: Callable[[str, list[str]], Any]) -> Any | None:
    """The job ``load(path, overrides)`` reads, or None once ``--print-config`` printed it (the
    command then exits 0 before anything runs)."""
    job = load(args.job, args.overrides)
    if args.print_config:
        print(config.dump_yaml(job), end="")
        return None
    return job


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    if not verbose:  # the object-store clients' notes ("Found credentials in environment variables") are -v's
        for name in ("botocore", "aiobotocore", "s3fs"):
            logging.getLogger(name).setLevel(logging.WARNING)
    store_close_noise_to_the_log(logging.DEBUG)  # an s3fs upload failing to close when collected: -v's, not ~30 lines



def environment_error(e: BaseException) -> str | None:
    """One line for a failure of the machine rather than of gristmill (a full or read-only disk, an
    object store that does not answer), or None: anything else is a bug and keeps its traceback."""
    if is_disk_error(e):
        return os_error_text(e)
    boto = sys.modules.get("botocore.exceptions")  # loaded only if an object store was used
    if boto is not None and isinstance(e, boto.ConnectionError):
        return (f"cannot reach the object store ({e}); check that its endpoint (AWS_ENDPOINT_URL, the storage "
                "options) is up and reachable from here, then run the same command again")
    return None


def run(args: argparse.Namespace, handler: Callable[[argparse.Namespace], int | None] | None = None) -> int:
    """Call the command's handler (``args.handler`` unless given) under the error contract."""
    setup_logging(getattr(args, "verbose", False))
    try:
        return int((handler or args.handler)(args) or 0)
    except BrokenPipeError:  # `gristmill ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # noqa: BLE001 - what is not ours to explain is re-raised below
        # An error gristmill raised on purpose (or a full disk, an unreachable store) says what to
        # do in one line; -v shows where. Anything else is a bug and keeps its traceback.
        line = str(e) if isinstance(e, GristmillError) else environment_error(e)
        if line is None:
            raise
        if getattr(args, "verbose", False):
            traceback.print_exc()
        # a name that is not UTF-8 (surrogate-escaped) is shown escaped, never a second error while printing
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")
        print(f"gristmill {args.command}: error: {line}", file=sys.stderr)
        return 2


def add_storage_option_arguments(p: argparse.ArgumentParser, flag: str = "storage-option",
                                 of: str = "the stores a command reads") -> None:
    """``--storage-option KEY=VALUE`` (repeatable) and ``--storage-options-file F``: the fsspec options of
    ``of`` (credentials, an endpoint), for commands that take URLs rather than a job file. ``flag``
    names another pair for a second store (``work-dir-option``: ``--work-dir-option`` and
    ``--work-dir-options-file``, the job's ``work_dir_options``)."""
    p.add_argument(f"--{flag}", action="append", default=[], metavar="KEY=VALUE",
                   help=f"an fsspec option of {of} (repeatable); VALUE is read as YAML "
                        "(anon=true, client_kwargs={endpoint_url: http://minio:9000})")
    p.add_argument(f"--{flag}s-file", metavar="F",
                   help=f"a YAML mapping of fsspec options of {of} (the --{flag} flags override its keys)")


def storage_options(args: argparse.Namespace, flag: str = "storage-option") -> dict:
    """The options ``add_storage_option_arguments`` parsed for ``flag``: the file's mapping, then each flag;
    a malformed one is a one-line ``UsageError`` naming it."""
    import yaml

    from gristmill.errors import UsageError

    out: dict = {}
    dest = flag.replace("-", "_")
    if path := getattr(args, f"{dest}s_file", None):
        try:
            with open(path) as f:
                loaded = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as e:
            raise UsageError(f"--{flag}s-file {path}: {str(e).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"--{flag}s-file {path}: expected a YAML mapping of options")
        out.update(loaded)
    for item in getattr(args, dest, None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            raise UsageError(f"--{flag} {key.strip()}=...: VALUE is not YAML") from None
    return out
