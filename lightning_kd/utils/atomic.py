"""Files written whole or not at all: a temporary name beside the target, fsync, rename."""

from __future__ import annotations

import os
from pathlib import Path

TEMP_SUFFIX = ".partial"
"""The suffix of a file being written; a crash leaves at most such a file, never a torn target."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it: all of it or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
