"""A full disk named as one (and a file too large for its file system or a file-size limit, and a
write refused: a read-only mount, a directory this user may not write):
the path that could not be written, and what to do next.

A full disk reaches the package in several disguises: ``OSError`` ENOSPC with no path (a plain
``write``), torch's zip writer's ``RuntimeError`` ("PytorchStreamWriter failed writing file
data/3: file write failed"), safetensors' ``SafetensorError`` ("IoError ... No space left on
device"), numpy's short write ("1572864 requested and 162832 written"), or another error raised
as the ENOSPC was handled (the zip writer's "unexpected pos" as it closes). :func:`disk_errors`
turns each into ``OSError(ENOSPC, "no space left on <path>: ...")`` with the step that follows
(free space, then resume or run again), the original chained.
"""

from __future__ import annotations

import errno
import re
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
"""A file system mounted read-only, or a directory this user may not write (probe 47: a
checkpoint directory made read-only mid-run was two chained tracebacks)."""
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
"""The errnos of a full disk, or of a quota reached."""
TOO_LARGE = errno.EFBIG
"""A file past the file system's largest (FAT32's 4 GiB) or a file-size limit (``ulimit -f``)."""
NEARLY_FULL = 16 * 2**20
"""Free bytes under which a write that failed without saying why is put down to a full disk."""
WRITE_FAILED = ("PytorchStreamWriter failed writing file", "file write failed")
"""torch's zip writer's words for a failed write (it keeps the errno to itself)."""
SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")
"""numpy's ``tofile`` (the GGUF writer's) on a short write, an ``OSError`` with no errno."""


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem of ``path`` (its nearest existing ancestor), if readable."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def is_disk_full(error: BaseException, path: Path) -> bool:
    """Whether ``error``, raised writing ``path``, is a full disk in any of its disguises, or
    raised while one was handled (torch's zip writer, closing a file the disk had no room for,
    says "unexpected pos 484416 vs 484308" over the ENOSPC)."""
    return any(names_full_disk(raised, path) for raised in causes(error))


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from or while handling, and so on (each once)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def full_disk_message(error: OSError) -> str | None:
    """What a command prints, alone, for ``error`` where it is a full disk, or a write
    :func:`disk_errors` found refused (the message it gave names the path and the way on);
    None for any other error."""
    if error.errno not in (*FULL_DISK, TOO_LARGE) and not isinstance(error, WriteRefused):
        return None
    return f"{error.strerror or error}" + (f" ({error.filename})" if error.filename else "")


def names_full_disk(error: BaseException, path: Path) -> bool:
    """Whether ``error`` itself says the disk is full."""
    if isinstance(error, OSError) and error.errno in FULL_DISK:
        return True
    message = str(error)
    if "No space left on device" in message or "Disk quota exceeded" in message:
        return True  # safetensors' and others' wrapped IoError
    short = isinstance(error, OSError) and SHORT_WRITE.search(message) is not None
    if short or (isinstance(error, RuntimeError) and any(w in message for w in WRITE_FAILED)):
        free = free_bytes(path)
        return free is not None and free < NEARLY_FULL
    return False


class WriteRefused(OSError):
    """A write :func:`disk_errors` found refused (:data:`UNWRITABLE`), its message the path and
    the way on."""


@contextmanager
def disk_errors(path: str | Path, then: str) -> Iterator[None]:
    """Run a write of ``path``; a full disk leaves as ``OSError(ENOSPC)`` naming ``path`` and
    ``then``, the next step (e.g. ``resume with ckpt_path=last``), a refused one as
    :class:`WriteRefused` saying the same."""
    try:
        yield
    except Exception as error:
        if too_large(error):
            raise OSError(
                TOO_LARGE,
                f"{path} is larger than its file system or a file-size limit (ulimit -f, a "
                "scheduler's) allows: write it to another file system, or raise the limit, then "
                f"{then}",
            ) from error
        if isinstance(error, OSError) and error.errno in UNWRITABLE:
            raise WriteRefused(
                error.errno,
                f"{path} cannot be written ({error.strerror}): make it writable (a read-only "
                f"mount, a directory's permissions), then {then}",
            ) from error
        if not is_disk_full(error, Path(path)):
            raise
        raise OSError(errno.ENOSPC, f"no space left on {path}: free space and {then}") from error


def too_large(error: BaseException) -> bool:
    """Whether ``error`` is, or was raised while handling, an EFBIG (torch's zip writer says
    "unexpected pos" over it as it closes), or numpy's short write (no errno) under a file-size
    limit (``ulimit -f``)."""
    limited = resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
    for raised in causes(error):
        if isinstance(raised, OSError) and raised.errno == TOO_LARGE:
            return True
        if limited and isinstance(raised, OSError) and SHORT_WRITE.search(str(raised)):
            return True
    return False
