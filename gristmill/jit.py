"""numba's ``njit`` with its on-disk cache when there is somewhere to write it, and without otherwise.

numba picks a cache directory when a ``cache=True`` function is decorated, that is at import:
``NUMBA_CACHE_DIR``, else the ``__pycache__`` next to the source file, else the user-wide cache
directory (``~/.cache/numba``). When none of them is writable (a read-only install, a read-only
or missing home, a container) the decorator raises ``RuntimeError: cannot cache function ...``
and the import fails. :func:`cached_njit` falls back to compiling without the disk cache then:
each process compiles the function again on first use (about a second for the loader's kernel),
and a warning says how to get the cache back.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def cached_njit(**options):
    """``numba.njit(cache=True, **options)``, or ``numba.njit(**options)`` when numba finds no writable cache dir."""
    import numba

    def decorate(fn):
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError as e:
            if "cannot cache function" not in str(e):
                raise
            log.warning("%s; compiling %s in every process instead (about a second each). Point NUMBA_CACHE_DIR at a "
                        "writable directory to cache it.", e, fn.__qualname__)
            return numba.njit(**options)(fn)

    return decorate
