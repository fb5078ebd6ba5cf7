"""One writer at a time: an exclusive, non-blocking ``flock`` on a lock file, its holder named.

Two processes writing one output each believe they wrote it; the second to finish has replaced
or interleaved the first's work. :func:`writer_lock` refuses the second at once (it does not wait:
a writer that waited would then redo or append to what the first wrote) with the holder's pid.
The kernel releases an ``flock`` when its holder's last descriptor closes, so a writer killed
with ``kill -9`` leaves no stale lock behind. The lock is re-entrant within one process: a
command that takes it before launching its workers, and the library function it then calls,
which takes it too, hold it once.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lightning_kd.utils.refusal import Refused


class WriterLocked(Refused, RuntimeError):
    """Another process holds the writer lock of an output: refused as every command refuses
    its input (exit 2 with the message and its fix), not a traceback."""


_held: dict[Path, int] = {}
"""Lock files this process holds, with their descriptors (for re-entrance)."""


class LockHeld(RuntimeError):
    """Another process holds a lock file; ``holder`` is the pid it wrote there."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by pid {holder}")
        self.path, self.holder = path, holder


def take_lock(path: Path) -> int:
    """A descriptor holding an exclusive ``flock`` on ``path`` (created if needed), this
    process's pid written in it; :class:`LockHeld` at once if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():  # a copy tool's or a hand's: an IsADirectoryError traceback (probe 59)
        raise Refused(f"{path} is a directory where a lock file belongs: remove it (rmdir)")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise LockHeld(path, holder) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


@contextmanager
def writer_lock(path: Path, what: str, fix: str) -> Iterator[None]:
    """Hold the exclusive lock ``path`` for the block, or raise :class:`WriterLocked` naming
    ``what`` is written, the holder's pid and ``fix``."""
    path = Path(path).absolute()
    if path in _held:  # this process holds it already (see the module doc)
        yield
        return
    try:
        _held[path] = take_lock(path)
    except LockHeld as held:
        raise WriterLocked(
            f"{what} is being written by another process (pid {held.holder}, holding {path}); {fix}"
        ) from None
    try:
        yield
    finally:
        os.close(_held.pop(path))  # releases the lock


def lock_holder(path: Path) -> str | None:
    """The pid another process holding the lock ``path`` wrote there, or None where nobody
    else holds it (this process's own locks, or no lock file, are none)."""
    path = Path(path).absolute()
    if path in _held or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.read(fd, 64).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # releases a lock taken just now
    return None


_reading: dict[Path, int] = {}
"""Shared locks this process holds on what it reads, by lock file (one each)."""


def hold_shared(path: Path) -> None:
    """Hold a shared ``flock`` on ``path`` (created if need be) until this process ends or
    :func:`in_use_elsewhere` asks about it: readers of one thing together, which a process
    about to replace that thing finds. Nothing held where the lock file cannot be written (a
    read-only directory): a reader is never refused for it."""
    path = Path(path).absolute()
    if path in _reading:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except OSError:
        return
    fcntl.flock(fd, fcntl.LOCK_SH)
    _reading[path] = fd


def let_go(path: Path) -> None:
    """Let go of this process's shared hold on ``path`` (:func:`hold_shared`), if any."""
    path = Path(path).absolute()
    if path in _reading:
        os.close(_reading.pop(path))


def in_use_elsewhere(path: Path) -> bool:
    """Whether another process holds ``path``: shared (:func:`hold_shared`), or as its writer
    (:func:`take_lock`); this process's own shared hold is let go first: it asks because it is
    done reading. Only asks: the file and the pid its writer wrote there stay as they are."""
    path = Path(path).absolute()
    let_go(path)
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


LOCAL_RANKS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
"""Where launchers put a process's rank on its machine (torchrun and Lightning, SLURM, MPI)."""


def local_rank() -> int:
    """This process's rank on its machine, as its launcher set it (0 without one)."""
    for name in LOCAL_RANKS:
        if (value := os.environ.get(name, "")).isdigit():
            return int(value)
    return 0


@contextmanager
def waiting_lock(path: str | Path, what: str) -> Iterator[None]:
    """``filelock``'s blocking lock on ``path`` for the block: where another process holds it,
    a line first says what this one waits for (``what``: ``for the conversion of X``). Runs
    waited minutes on another's conversion or cache write without a word (probe 48). Said by
    one process of a machine: a DDP launch's ranks all wait on their rank 0's conversion."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if local_rank() == 0:
            print(f"waiting {what}: another process holds {path}", flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
