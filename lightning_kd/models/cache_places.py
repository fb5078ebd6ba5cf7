"""Where the package's cache lives: :func:`cache_root`, written to (data files' digests,
tokenized data, converted GGUF weights, teacher caches), and the read-only caches a site or a
container image shares, ``$LIGHTNING_KD_SHARED_CACHE``.

A converted GGUF teacher is the package cache's costly entry (28 s and 520 MB for SmolLM2 here,
far more for a large teacher). A team that converts it once into a read-only place (an NFS
share, a layer of its image) could not share it: ``$LIGHTNING_KD_CACHE`` must be writable
(digests, tokenized data, teacher caches are written there), and each user converted again or
copied it (probe 48). The shared caches are searched first for what is only read there:
conversions and assembled GGUF files, each taken only when whole and of the GGUF's digest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from lightning_kd.utils.files import remembered_digest


def cache_root() -> Path:
    """Where converted GGUF weights live: ``$LIGHTNING_KD_CACHE`` (a ``~`` in it expanded:
    quoted in a job script it was a directory named ``~``, probe 48) or
    ``$XDG_CACHE_HOME/lightning_kd`` (``~/.cache/lightning_kd``)."""
    if env := os.environ.get("LIGHTNING_KD_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lightning_kd"


DIGEST_CHARS = 20
"""Hex digits of the GGUF's sha256 in its converted directory's name."""


def remembered_file_digest(path: Path) -> str:
    """sha256 of ``path``'s bytes (a GGUF, a data file), remembered in
    ``cache_root()/file_digests`` while the file is unchanged (path, size, mtime, inode): hashing
    SmolLM2's 98 MB GGUF took 3.5 s here, and a large corpus would cost as much on every run."""
    return remembered_digest(path, cache_root() / "file_digests")


SHARED_ENV = "LIGHTNING_KD_SHARED_CACHE"
"""Directories laid out as ``$LIGHTNING_KD_CACHE`` is, read-only, separated by ``:``."""


def shared_roots() -> list[Path]:
    """The directories ``$LIGHTNING_KD_SHARED_CACHE`` names, in its order (``~`` expanded)."""
    value = os.environ.get(SHARED_ENV, "")
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part.strip()]


def first_shared(relative: Path, whole: Callable[[Path], bool]) -> Path | None:
    """The first shared cache's ``relative`` entry that ``whole`` accepts, or None."""
    for root in shared_roots():
        candidate = root / relative
        if candidate.exists() and whole(candidate):
            return candidate
    return None
