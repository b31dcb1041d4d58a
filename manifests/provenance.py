"""Which code made an artifact: the package version plus the git commit when there is one."""
from __future__ import annotations

import functools
import os
import subprocess

from gristmill import __version__


@functools.cache
def code_version() -> str:
    # Images carry no .git: their build sets GRISTMILL_CODE_VERSION (deploy/Dockerfile.*).
    if override := os.environ.get("GRISTMILL_CODE_VERSION"):
        return override
    version = __version__
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "-C", repo, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"gristmill {version}+g{commit}" if commit else f"gristmill {version}"
