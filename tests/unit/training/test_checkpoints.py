"""Checkpoint files: crash-safe writes, local-only weights_only reads, bad files named."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from lightning_kd.cli.hydra_command import run_hydra
from lightning_kd.training.checkpoints import (
    CheckpointError,
    SafeCheckpointIO,
    atomic_torch_save,
    resolve_ckpt_path,
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoints" / "last.ckpt"
    SafeCheckpointIO().save_checkpoint({"global_step": 3, "w": torch.ones(4)}, path)
    return path


def test_save_replaces_the_file_and_leaves_no_temporary(saved: Path) -> None:
    SafeCheckpointIO().save_checkpoint({"global_step": 4}, saved)
    assert SafeCheckpointIO().load_checkpoint(saved)["global_step"] == 4
    assert os.listdir(saved.parent) == ["last.ckpt"]


def test_a_failed_write_keeps_the_previous_file(saved: Path) -> None:
    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_torch_save({"global_step": 4, "bad": Unpicklable()}, saved)
    assert SafeCheckpointIO().load_checkpoint(saved)["global_step"] == 3
    assert os.listdir(saved.parent) == ["last.ckpt"]


@pytest.mark.parametrize("cut", [0, 100, -200])
def test_empty_or_truncated_checkpoints_are_named(saved: Path, cut: int) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[:cut])  # empty, its first bytes, or all but its end
    with pytest.raises(CheckpointError, match=rf"{saved}.*(empty|truncated or corrupt)"):
        resolve_ckpt_path(str(saved), saved.parent)
    with pytest.raises(CheckpointError, match=str(saved)):
        SafeCheckpointIO().load_checkpoint(saved)


def test_a_pickle_payload_is_not_run(tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": Payload()}, path)
    with pytest.raises(CheckpointError, match="cannot be read"):
        SafeCheckpointIO().load_checkpoint(path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "url", ["http://example.com/x.ckpt", "https://h/x.ckpt", "s3://bucket/x.ckpt", "gs://b/x"]
)
def test_urls_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(CheckpointError, match="only local checkpoint files"):
        resolve_ckpt_path(url, tmp_path)
    with pytest.raises(CheckpointError, match="only local"):
        SafeCheckpointIO().load_checkpoint(url)


def test_last_names_the_run_directory_checkpoint(saved: Path, tmp_path: Path) -> None:
    assert resolve_ckpt_path("last", saved.parent) == saved
    assert resolve_ckpt_path(None, saved.parent) is None
    # Said of a run started without hydra.run.dir, the directory named was the timestamped one
    # Hydra had just made (probe 41): the fix is to name the run's own.
    with pytest.raises(CheckpointError, match=r"has no checkpoint yet.*hydra.run.dir=DIR ckpt"):
        resolve_ckpt_path("last", tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="no checkpoint file at"):
        resolve_ckpt_path(str(tmp_path / "missing.ckpt"), saved.parent)
    # The run directory named holds a run killed before its first checkpoint: it was told to
    # give hydra.run.dir, which it had (probe 47).
    (tmp_path / "stopped" / "logs").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"stopped before its first checkpoint .* overwrite"):
        resolve_ckpt_path("last", tmp_path / "stopped" / "checkpoints")


def test_a_checkpoint_the_disk_has_no_room_for_keeps_the_last_one(tmp_path, monkeypatch) -> None:
    path = tmp_path / "checkpoints" / "last.ckpt"
    atomic_torch_save({"global_step": 4}, path)

    def full_disk(obj, handle) -> None:
        handle.write(b"PK\x03\x04 a few bytes of the new archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(
        OSError, match=f"no space left on {path}: free space and resume with"
    ) as error:
        atomic_torch_save({"global_step": 8}, path)
    assert error.value.errno == errno.ENOSPC and "ckpt_path=last" in str(error.value)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"global_step": 4}
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_the_first_checkpoint_the_disk_has_no_room_for_says_start_again(tmp_path, monkeypatch):
    """It said "resume with ckpt_path=last", which is refused where no checkpoint exists
    (probe 33)."""

    def full_disk(obj, handle) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    path = tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(OSError, match=r"free space and start the run again \(overwrite=true\)"):
        atomic_torch_save({"global_step": 8}, path)


def test_a_directory_is_not_taken_for_a_checkpoint(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"is a directory, not a checkpoint") as error:
        resolve_ckpt_path(str(saved.parent), tmp_path)
    assert f"e.g. ckpt_path={saved}" in str(error.value), "the .ckpt inside is suggested"
    deepspeed = tmp_path / "ds.ckpt"  # DeepSpeed's checkpoints are directories with a tag file
    deepspeed.mkdir()
    (deepspeed / "latest").write_text("global_step3")
    assert resolve_ckpt_path(str(deepspeed), tmp_path) == deepspeed


def test_a_full_disk_ends_the_command_with_its_message_alone(tmp_path, capsys) -> None:
    """No traceback under it (Hydra printed one, the ENOSPC and its disguises chained): the
    message names the file and the way on."""
    message = f"no space left on {tmp_path}/last.ckpt: free space and resume with ckpt_path=last"

    def full(cfg) -> None:
        raise OSError(errno.ENOSPC, message)

    with pytest.raises(SystemExit) as exit_:
        run_hydra(full, ["debug=smoke", f"hydra.run.dir={tmp_path}/run"])
    assert exit_.value.code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"lightning-kd: {message}"

    def denied(cfg) -> None:
        raise OSError(errno.EACCES, "Permission denied")

    with pytest.raises(SystemExit):  # anything else goes on to Hydra, which shows its traceback
        run_hydra(denied, ["debug=smoke", f"hydra.run.dir={tmp_path}/run2"])
    assert "lightning-kd: " not in capsys.readouterr().err
