"""Content digests of files: streamed, and remembered across runs while a file stays unchanged.

A name and a size do not identify a file's content (a re-upload, a same-size fine-tune); its
sha256 does. Hashing a 250 MB file on every run costs seconds, so :func:`remembered_digest` keeps
the digest in a small record keyed by what changes when the file does: path, size, mtime
(nanoseconds), device and inode. A rewrite in place changes the mtime; a replacement by rename
changes the inode. A file modified within the last :data:`SETTLE_SECONDS` is hashed but not
recorded: a rewrite of the same size within one tick of the file system's clock (coarse: up to
2 s on some) would keep the mtime the record holds ("racy git").

Also: files written as the user's umask allows, and the file that blocks a path from being a
directory (:func:`blocking_file`), for the commands' output checks and the cache reader alike.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from lightning_kd.utils.atomic import atomic_write_bytes

SETTLE_SECONDS = 2.0
"""How long after its last change a file's digest may be remembered (see the module doc)."""


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_identity(path: Path) -> dict[str, str | int]:
    """What changes when ``path``'s content may have: its resolved path, size, mtime, inode,
    and its ctime, which no one sets back (an edit in place whose mtime was put back, by
    ``touch -d`` or ``cp -p``, kept the old digest; probe 37)."""
    resolved = path.resolve()
    stat = resolved.stat()
    return {
        "path": str(resolved),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "ctime_ns": stat.st_ctime_ns,
        "device": stat.st_dev,
        "inode": stat.st_ino,
    }


def current_identity(path: Path) -> dict[str, str | int] | None:
    """:func:`file_identity` of ``path``, None where it is gone."""
    try:
        return file_identity(path)
    except FileNotFoundError:
        return None


def remembered_digest(path: Path, memo_dir: Path) -> str:
    """:func:`file_digest` of ``path``, from its record in ``memo_dir`` when the file's identity
    is the one recorded (else hashed and recorded). One record per path, written whole: two
    processes hashing one file at once write the same record."""
    identity = file_identity(path)
    name = hashlib.sha256(str(identity["path"]).encode()).hexdigest()[:20]
    record = memo_dir / f"{name}.json"
    try:
        remembered = json.loads(record.read_text())
    except (OSError, ValueError):
        remembered = {}
    if {key: remembered.get(key) for key in identity} == identity and "sha256" in remembered:
        return remembered["sha256"]
    digest = file_digest(path)
    if time.time_ns() - int(identity["mtime_ns"]) < SETTLE_SECONDS * 1e9:
        return digest
    text = json.dumps(identity | {"sha256": digest}, indent=1, sort_keys=True) + "\n"
    atomic_write_bytes(record, text.encode())
    return digest


def as_umask_allows(directory: Path) -> None:
    """Give the files under ``directory`` the permissions this process's umask allows a new
    file (``0o666 & ~umask``): transformers writes ``model.safetensors`` 0600, so a student in
    a team's shared run directory was unreadable to the rest of the team (probe 47)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def blocking_file(path: Path) -> Path | None:
    """``path`` or the nearest directory above it that exists as something else than a
    directory (a file: nothing can be created under it), else None."""
    for candidate in (path, *path.parents):
        try:
            if candidate.exists() or candidate.is_symlink():
                return None if candidate.is_dir() else candidate
        except OSError:  # a name too long to ask about: nothing there to block it
            continue
    return None
