"""A checkpoint damaged inside, or unpickled as something else: refused, naming the file."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from lightning_kd.training.checkpoint_files import CheckpointError, check_whole, load_local


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "last.ckpt"
    torch.save({"global_step": 3, "w": torch.arange(4096, dtype=torch.float32)}, path)
    return path


def damage(path: Path, member_suffix: str, byte: int) -> None:
    """Overwrite the first 256 bytes of the zip member whose name ends with ``member_suffix``
    in place, as bit rot or a partial overwrite would: its directory and size stay whole."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(member_suffix))
        with archive.open(info) as member:
            member.read(1)
            start = member._fileobj.tell() - 1  # where its bytes begin in the file
    data = bytearray(path.read_bytes())
    data[start : start + 256] = bytes([byte]) * 256
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("member", "byte"), [("data/0", 0x00), ("data.pkl", 0x41)])
def test_bytes_changed_inside_are_refused_before_loading(saved: Path, member, byte) -> None:
    """Zeros in a tensor resumed silently (a weight of zeros, exit 0); a garbled pickle was
    called a foreign one, with torch's advice to load it with weights_only=False."""
    damage(saved, member, byte)
    with pytest.raises(CheckpointError) as error:
        check_whole(saved)
    message = str(error.value)
    assert message.startswith(f"checkpoint {saved} is corrupt: its part ")
    assert "does not match the checksum written with it" in message
    assert message.endswith(
        "resume from an earlier checkpoint (ckpt_path=PATH) or start afresh (overwrite=true)"
    )
    with pytest.raises(CheckpointError, match="is corrupt"):
        load_local(saved)


def test_a_damaged_repair_state_is_told_to_start_afresh(saved: Path) -> None:
    """It was told to resume from an earlier checkpoint, which a repair's progress has none of,
    and given no command (probe 59)."""
    repair = saved.with_name("repair.pt")
    repair.write_bytes(saved.read_bytes()[:100])
    with pytest.raises(CheckpointError) as error:
        check_whole(repair)
    assert str(error.value).endswith(
        "the repair's progress has no earlier copy: start the run afresh (overwrite=true)"
    )


def test_an_intact_file_is_read_once_per_version(saved: Path, monkeypatch) -> None:
    """The CRCs cost a read of the whole file: checked once, again only if the file changes."""
    reads = []
    original = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip", lambda self: reads.append(1) or original(self))
    assert load_local(saved, mmap=True)["global_step"] == 3
    check_whole(saved)
    assert len(reads) == 1
    torch.save({"global_step": 4}, saved)
    assert load_local(saved)["global_step"] == 4 and len(reads) == 2


def test_a_foreign_pickle_is_named_without_the_advice_to_run_it(tmp_path: Path) -> None:
    path = tmp_path / "foreign.ckpt"
    torch.save({"global_step": 1, "x": zipfile.ZipInfo("x")}, path)
    with pytest.raises(CheckpointError) as error:
        load_local(path)
    message = str(error.value)
    assert "holds objects other than tensors and plain data" in message
    assert "WeightsUnpickler error: Unsupported global" in message
    assert "weights_only set to False" not in message and "weights_only=False" not in message
