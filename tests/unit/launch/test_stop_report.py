"""What a run stopped in training prints: the resume command, led by what it waits for."""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

from lightning_kd.launch.stop_report import stop_report
from lightning_kd.utils.stopping import Interrupted


def saved_at(tmp_path: Path, step: int) -> SimpleNamespace:
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    last.write_bytes(b"a checkpoint")
    return SimpleNamespace(path=last, saved_step=step)


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
