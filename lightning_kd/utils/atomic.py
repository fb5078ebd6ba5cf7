"""Files and directories written whole or not at all: a temporary name beside the target, fsync,
rename."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from lightning_kd.utils.disk import disk_errors

TEMP_SUFFIX = ".partial"
"""The suffix of a file being written; a crash leaves at most such a file, never a torn target."""


def atomic_write_bytes(path: Path, data: bytes, then: str = "run the command again") -> None:
    """Write ``data`` to ``path`` through a temporary file beside it: all of it or nothing. A
    full disk names ``path`` and ``then``, the next step once space is freed."""
    with replaced_whole(path) as temp, disk_errors(path, then), open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


@contextmanager
def replaced_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; renamed onto ``path`` when the
    block succeeds, removed when it fails, so ``path`` holds the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_orphans(path)
    temp = path.with_name(f".{path.name}.{writer()}{TEMP_SUFFIX}")
    try:
        yield temp
        os.replace(temp, path)
    except BaseException:
        with suppress(OSError):  # a read-only file system refuses even this: say the first
            temp.unlink(missing_ok=True)
        raise


def writer() -> str:
    """This process, as a temporary file names its writer: ``<host>-<pid>`` (a pid alone means
    nothing on a filesystem several machines share)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def drop_orphans(path: Path) -> None:
    """Remove the temporary files of ``path`` left by writers of this machine that died without
    cleaning up (``kill -9``, a power cut): their pid names no running process. Another
    machine's, a live writer's and one whose pid cannot be asked about stay."""
    host = socket.gethostname()
    for temp in path.parent.glob(f".{path.name}.*{TEMP_SUFFIX}"):
        name, _, pid = temp.name[len(path.name) + 2 : -len(TEMP_SUFFIX)].rpartition("-")
        if name == host and pid.isdigit() and int(pid) != os.getpid() and not running(int(pid)):
            with suppress(OSError):  # one that cannot be removed stays, as a live writer's
                temp.unlink(missing_ok=True)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def replaced_directory(path: Path) -> Iterator[Path]:
    """:func:`atomic_directory` where ``path`` may exist already (a student exported again):
    the new one is renamed in, then the old one removed. A crash leaves the old directory or
    the new one whole, at worst beside hidden leftovers the next writer removes."""
    new, old = path.with_name(f".{path.name}.new"), path.with_name(f".{path.name}.old")
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    with atomic_directory(new) as temp:
        yield temp
    if path.exists():
        os.rename(path, old)
    os.rename(new, path)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """A temporary directory beside ``path`` for the block to fill, renamed to ``path`` once the
    block ends (its files fsynced first), removed if the block raises: a reader never finds a
    half-written ``path``. The caller is its only writer (it holds a lock): a crash's leftover
    temporary directory is removed by the next writer, which reuses its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        yield temp
        for file in (entry for entry in temp.rglob("*") if entry.is_file()):
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
        os.rename(temp, path)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
