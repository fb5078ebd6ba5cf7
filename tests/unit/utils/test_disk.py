"""A full disk is named as one: the path that could not be written, and the way on; the file that
was there before is kept whole."""

from __future__ import annotations

import errno
import os
from collections import namedtuple
from pathlib import Path

import pytest
from safetensors import SafetensorError

from lightning_kd.utils import disk
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.disk import disk_errors, full_disk_message, is_disk_full

Usage = namedtuple("Usage", "total used free")
STREAM_WRITER = RuntimeError(
    "[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
    "data/3: file write failed"
)


def while_handling(error: Exception, cause: Exception) -> Exception:
    """``error`` as raised while ``cause`` was handled (its ``__context__``)."""
    try:
        try:
            raise cause
        except Exception:
            raise error  # noqa: B904 - the implicit chaining is the point
    except Exception as raised:
        return raised


UNEXPECTED_POS = while_handling(
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 484416 vs 484308"),
    OSError(errno.ENOSPC, "No space left on device"),
)


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_names_the_path_and_keeps_the_earlier_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "cache" / "index.json"
    atomic_write_bytes(path, b"the earlier index\n")
    monkeypatch.setattr(os, "fsync", no_space)  # the kernel reports it when the bytes land
    with pytest.raises(OSError) as error:
        atomic_write_bytes(path, b"the new index\n", then="run the same command again")
    assert error.value.errno == errno.ENOSPC
    assert str(error.value) == (
        f"[Errno 28] no space left on {path}: free space and run the same command again"
    )
    assert isinstance(error.value.__cause__, OSError)
    assert path.read_bytes() == b"the earlier index\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["index.json"]  # no temporary left


@pytest.mark.parametrize(
    ("error", "free", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), 10**12, True),
        (SafetensorError('IoError(Os { code: 28, message: "No space left on device" })'), 0, True),
        (STREAM_WRITER, 4096, True),  # torch keeps the errno: judged by the free space
        (STREAM_WRITER, 10**12, False),  # a failed write on a disk with room: something else
        (UNEXPECTED_POS, 10**12, True),  # the zip writer closing over the ENOSPC of a write
        (OSError("1572864 requested and 162832 written"), 4096, True),  # numpy, the GGUF's
        (OSError("1572864 requested and 162832 written"), 10**12, False),
        (while_handling(ValueError("x"), OSError(errno.EACCES, "Denied")), 0, False),
    ],
)
def test_each_disguise_of_a_full_disk_is_recognised(
    error: Exception, free: int, full: bool, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - free, free))
    assert is_disk_full(error, tmp_path / "not" / "yet" / "there.ckpt") == full
    if not full:  # anything else passes unchanged
        with pytest.raises(type(error)) as raised, disk_errors(tmp_path, "resume"):
            raise error
        assert raised.value is error


def test_a_full_disk_ends_a_plain_command_with_its_message_alone(monkeypatch, capsys) -> None:
    """``export``, ``evaluate``, ``bench`` (commands without Hydra) printed the traceback."""
    import lightning_kd.cli.export as export
    from lightning_kd.cli import main

    def full(argv) -> None:
        raise OSError(errno.ENOSPC, "no space left on /x.gguf: free space and export again")

    monkeypatch.setattr(export, "main", full)
    assert main(["export", "run"]) == 1
    err = capsys.readouterr().err
    assert err == "lightning-kd export: no space left on /x.gguf: free space and export again\n"


def test_a_file_too_large_for_its_file_system_is_named_with_the_way_on(tmp_path: Path) -> None:
    """EFBIG (``ulimit -f``, a scheduler's file-size limit, FAT32's 4 GiB) fell through as a
    double traceback, torch's "unexpected pos" over the OSError."""
    path = tmp_path / "last.ckpt"
    cause = while_handling(
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 485056 vs 484948"),
        OSError(errno.EFBIG, "File too large"),
    )
    with pytest.raises(OSError) as error, disk_errors(path, "resume with ckpt_path=last"):
        raise cause
    assert error.value.errno == errno.EFBIG
    assert str(error.value).startswith(f"[Errno 27] {path} is larger than its file system or a ")
    assert "(ulimit -f, a scheduler's)" in str(error.value)
    assert str(error.value).endswith("then resume with ckpt_path=last")
    assert full_disk_message(error.value) is not None  # a command prints it alone


def test_numpys_short_write_under_a_file_size_limit_is_named_too_large(tmp_path, monkeypatch):
    """The GGUF writer's numpy short write (no errno) under ``ulimit -f`` was a traceback."""
    import resource

    short = OSError("2048 requested and 112 written")
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(10**12, 0, 10**12))
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (50 * 512, resource.RLIM_INFINITY))
    with pytest.raises(OSError) as error, disk_errors(tmp_path / "x.gguf", "export again"):
        raise short
    assert error.value.errno == errno.EFBIG and "file-size limit" in str(error.value)
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY,) * 2)
    with pytest.raises(OSError) as error, disk_errors(tmp_path / "x.gguf", "export again"):
        raise short
    assert error.value is short  # no limit and room on the disk: something else, unchanged


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_refused_write_names_the_path_and_the_way_on(tmp_path: Path, monkeypatch, code) -> None:
    """A checkpoint directory made read-only mid-run: the write's EROFS, then the cleanup's
    own EROFS (unlinking the temporary the failed open never made), two chained tracebacks
    through Hydra (probe 47). Now one message, as a full disk's."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    atomic_write_bytes(path, b"the earlier checkpoint")
    real_open = open

    def refused(file, *args, **kwargs):
        if str(file).endswith(".partial"):
            raise OSError(code, os.strerror(code), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refused)
    monkeypatch.setattr(Path, "unlink", lambda *args, **kwargs: refuse(code))
    with pytest.raises(OSError) as error:
        atomic_write_bytes(path, b"the new one", then="resume with ckpt_path=last")
    monkeypatch.undo()
    assert isinstance(error.value, disk.WriteRefused) and error.value.errno == code
    assert str(error.value).endswith(
        f"{path} cannot be written ({os.strerror(code)}): make it writable (a read-only mount, a "
        "directory's permissions), then resume with ckpt_path=last"
    )
    assert full_disk_message(error.value) == error.value.strerror  # said alone, no traceback
    assert full_disk_message(OSError(code, "elsewhere")) is None  # one not from a write: as is
    assert path.read_bytes() == b"the earlier checkpoint"


def refuse(code: int):
    raise OSError(code, os.strerror(code))
