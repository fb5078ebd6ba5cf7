"""What a run stopped in training prints: the resume command, led by what it waits for."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import OmegaConf

from lightning_kd.data.errors import DataError
from lightning_kd.launch.stop_report import stop_report
from lightning_kd.training.finite import NonFiniteError
from lightning_kd.training.peers import as_peer_lost
from lightning_kd.utils.stopping import Interrupted


def saved_at(tmp_path: Path, step: int) -> SimpleNamespace:
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir(exist_ok=True)
    last.write_bytes(b"a checkpoint")
    return SimpleNamespace(path=last, saved_step=step)


def launched(monkeypatch, overrides: list[str]) -> None:
    """This process as a Hydra run of ``overrides`` (its record of them: a config, as Hydra's)."""
    hydra = SimpleNamespace(
        mode=RunMode.RUN,
        overrides=SimpleNamespace(task=OmegaConf.create(overrides)),
        runtime=SimpleNamespace(config_sources=[]),
        job=SimpleNamespace(config_name="config"),
    )
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: hydra))


def test_an_interrupted_run_is_told_to_resume_as_it_stands(tmp_path: Path) -> None:
    stop = Interrupted(signal.SIGTERM, "after optimizer step 5")
    report = stop_report(stop, saved_at(tmp_path, 5), tmp_path, ("lightning-kd", "train"))
    assert "SIGTERM received: stopped after optimizer step 5" in report
    assert "(optimizer step 5). Resume with:\n  lightning-kd train" in report
    assert report.rstrip().endswith("ckpt_path=last") and stop.reported


def test_an_error_is_told_to_resume_once_its_cause_is_fixed(tmp_path: Path) -> None:
    """A deterministic error (a bad row, a bug) recurs where the run resumes: the advice to
    resume as it stands would only fail again."""
    error = ValueError("row 812 of data.jsonl has no 'text'\nmore lines")
    report = stop_report(error, saved_at(tmp_path, 3), tmp_path, ("lightning-kd", "train"))
    assert "training stopped: ValueError: row 812 of data.jsonl has no 'text'\n" in report
    assert "(optimizer step 3). Once its cause is fixed (or has passed), resume with:" in report
    assert "more lines" not in report


def test_with_no_checkpoint_the_run_is_started_again(tmp_path: Path) -> None:
    error = RuntimeError("out of memory")
    report = stop_report(error, None, tmp_path, ("lightning-kd", "train"))
    assert "No checkpoint was written: there is nothing to resume from. Start again with:" in report


def test_a_diverged_run_is_given_a_smaller_rate(tmp_path: Path, monkeypatch) -> None:
    """It was told to resume with "optimizer.lr=<smaller>" and, with no checkpoint, to start
    again with the very rate that diverged."""
    overrides = ["debug=smoke", "optimizer.lr=0.5", "resume_reset_optimizer=false"]
    launched(monkeypatch, overrides)
    diverged = NonFiniteError("the training loss is not finite at optimizer step 4")
    report = stop_report(diverged, None, tmp_path, ("lightning-kd", "train"), lr=0.5)
    assert (
        "Start again with a tenth of the learning rate (lower it further if it diverges "
        "again), with:\n" in report
    )
    assert report.rstrip().endswith(
        f"lightning-kd train debug=smoke resume_reset_optimizer=false optimizer.lr=0.05 "
        f"hydra.run.dir={tmp_path}"
    )
    report = stop_report(diverged, saved_at(tmp_path, 3), tmp_path, ("lightning-kd", "train"), 0.5)
    assert (
        "Resume with a tenth of the learning rate (lower it further if it diverges again) "
        "and a fresh optimizer:" in report
    )
    assert report.rstrip().endswith(
        f"lightning-kd train debug=smoke optimizer.lr=0.05 resume_reset_optimizer=true "
        f"hydra.run.dir={tmp_path} ckpt_path=last"
    )
    # Not the rate: a divergence infinite where the teacher gives a token probability 0.
    infinite = NonFiniteError("the KD term alone is infinite", lower_rate=False)
    report = stop_report(infinite, saved_at(tmp_path, 3), tmp_path, ("lightning-kd",), 0.5)
    assert "Once its cause is fixed (or has passed), resume with" in report
    assert "optimizer.lr=0.5" in report and "0.05" not in report


def test_a_second_ctrl_c_is_told_once(tmp_path: Path) -> None:
    """The report with the checkpoint's step marks it told: the command's last handler printed
    it again, without the step."""
    stop = KeyboardInterrupt()
    report = stop_report(stop, saved_at(tmp_path, 7), tmp_path, ("lightning-kd", "train"))
    assert "stopped at once (a second SIGINT)" in report and "(optimizer step 7)" in report
    assert stop.reported


def test_a_resume_that_reset_the_optimizer_is_resumed_without_resetting_it_again(
    tmp_path: Path, monkeypatch
) -> None:
    """A run extended with resume_reset_optimizer=true, stopped after a checkpoint of its own:
    the printed resume kept the flag, which reset the optimizer once more at the stop's step
    (the student differed from an uninterrupted run's, probe 23). Stopped before one, its
    resume reads the checkpoint it started from and must reset it still."""
    overrides = ["debug=smoke", "resume_reset_optimizer=true", "resume_mismatch=warn"]
    launched(monkeypatch, overrides)
    stop = Interrupted(signal.SIGTERM, "after optimizer step 46")
    callback = saved_at(tmp_path, 46)
    callback.wrote_own = True
    report = stop_report(stop, callback, tmp_path, ("lightning-kd", "train"))
    assert report.rstrip().endswith(
        f"lightning-kd train debug=smoke hydra.run.dir={tmp_path} ckpt_path=last"
    )
    callback.wrote_own = False  # its last checkpoint is still the one it was resumed from
    report = stop_report(Interrupted(signal.SIGTERM, "x"), callback, tmp_path, ("lightning-kd",))
    assert "resume_reset_optimizer=true resume_mismatch=warn" in report


def test_a_process_left_by_a_lost_one_points_at_process_0s_checkpoints(tmp_path: Path) -> None:
    """On a node of its own, the process left was the only one to print, and printed a gloo
    traceback: now the stop, where process 0 keeps the checkpoints, and the resume command."""
    lost = as_peer_lost(RuntimeError("Read error: Connection reset by peer"), 1, 2)
    nowhere = SimpleNamespace(path=tmp_path / "checkpoints" / "last.ckpt", saved_step=None)
    report = stop_report(lost, nowhere, tmp_path, ("lightning-kd", "train"), rank=1)
    assert "training stopped: process 1 of the run found another of its 2 processes" in report
    assert "Process 0 writes the run's checkpoints, as " in report
    assert "If it wrote one, once its cause is fixed (or has passed), resume with:" in report
    resume, restart = [line.strip() for line in report.splitlines() if line.startswith("  ")]
    assert resume.endswith("ckpt_path=last") and lost.reported
    # Process 0 lost before its first checkpoint: the resume is refused, so the command that
    # starts again is told too (it was told by process 0 alone: probe 30).
    assert "If it wrote none (lost before its first), there is nothing to resume from" in report
    assert "ckpt_path" not in restart and restart.startswith("lightning-kd train")
    seen = stop_report(lost, saved_at(tmp_path, 4), tmp_path, ("lightning-kd", "train"), rank=1)
    assert "The latest checkpoint is " in seen and "(optimizer step 4)" in seen  # a shared disk


def test_an_override_with_an_interpolation_is_kept_as_typed(tmp_path: Path, monkeypatch) -> None:
    """Hydra's record of the overrides is a config: read item by item, OmegaConf resolved
    ``data.val_size=${data.batch_size}`` against Hydra's own config, which has no such key,
    and the stop's report was a traceback in place of the resume command."""
    overrides = ["debug=smoke", "data.val_size=${data.batch_size}"]
    launched(monkeypatch, overrides)
    report = stop_report(Interrupted(signal.SIGTERM, "x"), saved_at(tmp_path, 4), tmp_path, ())
    assert "'data.val_size=${data.batch_size}'" in report and "ckpt_path=last" in report


def test_a_bad_row_is_resumed_past_the_data_check_once_fixed(tmp_path: Path, monkeypatch) -> None:
    """A stream's bad row stops the run; fixed in place, the data differs from the checkpoint's
    record, and the printed resume was refused for it (`data.dataset.data_files: edited`,
    probe 37): it says so, and resumes with resume_mismatch=warn."""
    overrides = ["debug=smoke", "data.streaming=true", "resume_mismatch=error"]
    launched(monkeypatch, overrides)
    row = DataError("split 'train' row 20: column 'text' holds dict {\"nested\": 1}")
    report = stop_report(row, saved_at(tmp_path, 9), tmp_path, ("lightning-kd", "train"))
    assert "Once the data is fixed, resume with resume_mismatch=warn" in report
    assert report.rstrip().endswith(
        "lightning-kd train debug=smoke data.streaming=true resume_mismatch=warn "
        f"hydra.run.dir={tmp_path} ckpt_path=last"
    )


def test_a_full_disk_is_told_once(tmp_path: Path) -> None:
    """The one-line disk refusal came twice: after "training stopped:" and after "lightning-kd:"
    (probe 47)."""
    import errno

    full = OSError(errno.ENOSPC, "no space left on /r/last.ckpt: free space and resume")
    report = stop_report(full, saved_at(tmp_path, 7), tmp_path, ["lightning-kd", "train"])
    assert "training stopped: OSError: [Errno 28] no space left on /r/last.ckpt" in report
    assert full.reported  # the command does not print it again
    other = OSError(errno.EIO, "Input/output error")
    stop_report(other, saved_at(tmp_path, 7), tmp_path, ["lightning-kd", "train"])
    assert not getattr(other, "reported", False)  # a traceback still follows it
