"""Whether a run directory's checkpoint has training left to resume (``launch/work_left.py``)."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from lightning_kd.launch.work_left import check_work_left, run_of, time_limit
from lightning_kd.training.rundir import RunDirError


def run_dir(
    tmp_path, step: int, summary: dict | None = None, trained_s: float | None = None, epochs=0
):
    """A run directory whose checkpoint is at ``step`` after ``epochs`` whole epochs (its timer
    at ``trained_s`` seconds), with ``summary`` written."""
    progress = {"current": {"completed": epochs}}  # Lightning's fit loop state, as it saves it
    checkpoint = {"global_step": step, "callbacks": {}, "epoch": epochs}
    checkpoint["loops"] = {"fit_loop": {"epoch_progress": progress}}
    if trained_s is not None:
        checkpoint["callbacks"]["Timer"] = {"time_elapsed": {"train": trained_s}}
    (tmp_path / "checkpoints").mkdir()
    torch.save(checkpoint, tmp_path / "checkpoints" / "last.ckpt")
    if summary is not None:
        (tmp_path / "summary.json").write_text(json.dumps(summary))
    return tmp_path / "checkpoints" / "last.ckpt"


def trainer(**keys) -> object:
    return OmegaConf.create({"max_steps": 200} | keys)


def test_a_run_early_stopping_ended_is_finished(tmp_path) -> None:
    """It was resumed, trained past the stop and replaced its student (probe 47)."""
    reason = "Monitored metric val/ppl did not improve in the last 3 records."
    last = run_dir(tmp_path, 40, {"stopped_by": "early_stopping", "stopped_early": reason})
    with pytest.raises(RunDirError) as refused:
        check_work_left(last, trainer(), tmp_path)
    message = str(refused.value)
    assert f"early stopping ended it at optimizer step 40 ({reason})" in message
    assert message.endswith("resume without +callbacks=early_stopping")


def test_a_rollback_of_a_finished_run_to_a_kept_checkpoint_is_not_refused(tmp_path) -> None:
    """Going back to step 3 of a run early stopping ended at 6 was refused as training past the
    stop, naming step 3 as the stop (probe 50)."""
    reason = "Monitored metric val/ppl did not improve in the last 3 records."
    summary = {"stopped_by": "early_stopping", "stopped_early": reason, "steps": 6}
    last = run_dir(tmp_path, 3, summary)
    check_work_left(last, trainer(max_steps=6), tmp_path)


def test_a_run_max_time_ended_resumes_only_with_time_left(tmp_path) -> None:
    """Lightning's timer counts every launch's time: a resume with none left trained no step,
    exit 0, and rewrote the summary (probe 47)."""
    last = run_dir(tmp_path, 40, {"stopped_by": "max_time", "stopped_early": "..."}, 61.0)
    with pytest.raises(RunDirError, match=r"max_time=00:00:01:00 is spent already: .* for 0:01:01"):
        check_work_left(last, trainer(max_time="00:00:01:00"), tmp_path)
    check_work_left(last, trainer(max_time="00:00:02:00"), tmp_path)  # a minute left
    check_work_left(last, trainer(max_time={"minutes": 2}), tmp_path)
    check_work_left(last, trainer(), tmp_path)  # no limit


def test_a_run_at_max_steps_is_finished_and_one_stopped_before_resumes(tmp_path) -> None:
    last = run_dir(tmp_path, 200, {"stopped_by": None})
    with pytest.raises(RunDirError, match=r"is finished \(optimizer step 200 of .*=200"):
        check_work_left(last, trainer(), tmp_path)
    check_work_left(last, trainer(max_steps=400), tmp_path)  # extended
    (tmp_path / "summary.json").unlink()  # stopped (killed) at its last step, before the summary
    check_work_left(last, trainer(), tmp_path)


def test_a_finished_runs_checkpoint_given_by_path_to_a_new_directory_is_finished(tmp_path):
    """It "trained" nothing, exported the same student and wrote a summary of 6 steps into the
    new directory, exit 0 (probe 52). Given a longer run, it goes on there."""
    (tmp_path / "old").mkdir()
    last = run_dir(tmp_path / "old", 200, {"stopped_by": None})
    new = tmp_path / "new"
    assert run_of(last, new, own=False) == tmp_path / "old"
    with pytest.raises(RunDirError, match=rf"the run in {tmp_path / 'old'} is finished"):
        check_work_left(last, trainer(), run_of(last, new, own=False))
    check_work_left(last, trainer(max_steps=400), run_of(last, new, own=False))
    assert run_of(last, new, own=True) == new and run_of(None, new, own=False) is None
    assert run_of(tmp_path / "elsewhere.ckpt", new, own=False) is None  # outside a run


def test_a_run_at_max_epochs_is_finished(tmp_path) -> None:
    """An epoch-bounded run resumed at its last epoch with resume_reset_optimizer=true trained
    no step, exit 0, and rewrote its summary and student (probe 47)."""
    last = run_dir(tmp_path, 9, {"stopped_by": None}, epochs=3)
    bounded = trainer(max_steps=-1, max_epochs=3)
    finished = r"is finished \(optimizer step 9, epoch 3 of trainer.max_epochs=3, summary"
    with pytest.raises(RunDirError, match=finished):
        check_work_left(last, bounded, tmp_path)
    check_work_left(last, trainer(max_steps=-1, max_epochs=4), tmp_path)  # extended
    check_work_left(last, trainer(max_steps=-1, max_epochs=None), tmp_path)  # by steps
    (tmp_path / "summary.json").unlink()  # killed after its last step: the export is left
    check_work_left(last, bounded, tmp_path)


def test_max_time_is_read_as_lightning_reads_it() -> None:
    assert time_limit("01:02:03:04") == 93784.0
    assert time_limit({"hours": 1}) == 3600.0
    assert time_limit(None) is None


def test_a_resumed_finished_runs_summary_is_kept_aside(tmp_path) -> None:
    """Extended and then killed, its directory held the earlier run's summary (steps 200) with
    last.ckpt at 240 of 600: nothing said the run was unfinished (probe 47)."""
    from lightning_kd.launch.work_left import retire_summary

    run_dir(tmp_path, 200, {"steps": 200})
    (tmp_path / "summary.md").write_text("| optimizer steps |  | 200 |")
    retire_summary(tmp_path)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "summary.md").exists()
    assert json.loads((tmp_path / "earlier" / "summary-step-200.json").read_text()) == {
        "steps": 200
    }
    assert "200" in (tmp_path / "earlier" / "summary-step-200.md").read_text()
    retire_summary(tmp_path)  # a resume of a run with no summary: nothing to keep
