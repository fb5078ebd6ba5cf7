"""overwrite=true undone where the new run never wrote a checkpoint of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_kd.training.rundir import claim_run_dir
from lightning_kd.training.set_aside import ASIDE, set_aside
from lightning_kd.utils.refusal import Refused


def finished_run(run_dir: Path) -> None:
    for name in ("checkpoints", "student", "logs"):
        (run_dir / name).mkdir(parents=True)
    (run_dir / "checkpoints" / "last.ckpt").write_text("old checkpoint")
    (run_dir / "student" / "model.safetensors").write_text("old student")
    (run_dir / "logs" / "metrics.csv").write_text("step\n0\n")
    (run_dir / "summary.json").write_text("{}")
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("the old run's config")


def contents(run_dir: Path) -> dict[str, str]:
    return {
        str(path.relative_to(run_dir)): path.read_text()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and not path.name.startswith(".")
    }


def test_a_refused_overwrite_leaves_the_earlier_run_as_it_was(tmp_path: Path, capsys) -> None:
    """A LoRA target the student lacks, refused once the models were built, had removed the
    finished run's student, checkpoint and summary (probe 23). The record (``.hydra/``) is the
    earlier run's again too: it was the refused run's, beside the earlier outputs (probe 37)."""
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    before = contents(run_dir)
    assert before[".hydra/config.yaml"] == "the old run's config"
    with pytest.raises(Refused), claim_run_dir(run_dir, resuming=False, overwrite=True):
        assert not (run_dir / "student").exists()  # out of the way of the new run
        (run_dir / ".hydra").mkdir()  # the launch's record, written once the directory is its
        (run_dir / ".hydra" / "config.yaml").write_text("the refused run's config")
        (run_dir / "logs").mkdir()
        (run_dir / "logs" / "metrics.csv").write_text("step\n")  # the new run's, partial
        raise Refused("student.lora.target_modules: 'q_prj' matches no module")
    assert contents(run_dir) == before and not (run_dir / ASIDE).exists()
    assert "overwrite=true undone" in capsys.readouterr().out


def test_an_overwrite_that_wrote_a_checkpoint_or_ended_well_removes_the_earlier_run(
    tmp_path: Path,
) -> None:
    for fails in (True, False):
        run_dir = tmp_path / str(fails)
        finished_run(run_dir)
        try:
            with claim_run_dir(run_dir, resuming=False, overwrite=True):
                (run_dir / "checkpoints").mkdir()
                (run_dir / "checkpoints" / "last.ckpt").write_text("new checkpoint")
                if fails:  # stopped after its first checkpoint: resumable, the old run gone
                    raise RuntimeError("out of memory at step 60")
        except RuntimeError:
            assert fails
        assert contents(run_dir) == {"checkpoints/last.ckpt": "new checkpoint"}
        assert not (run_dir / ASIDE).exists()


def test_a_killed_overwriting_run_is_settled_by_the_next_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    before = contents(run_dir)
    set_aside(run_dir, ["checkpoints", "student", "logs", "summary.json"])  # then kill -9
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "metrics.csv").write_text("step\n")
    refused = pytest.raises(Refused, match="already holds")  # put back, then refused as before
    with refused, claim_run_dir(run_dir, resuming=False, overwrite=False):
        pass
    assert contents(run_dir) == before


def test_a_repair_stopped_with_its_progress_kept_is_the_new_runs(tmp_path: Path) -> None:
    """Stopped in its block-wise repair, the run said its progress was kept in repair.pt and
    to resume from it; the undo then put the earlier run back over checkpoints/ and the
    resume was refused as a finished run's (probe 59)."""
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    with pytest.raises(KeyboardInterrupt), claim_run_dir(run_dir, resuming=False, overwrite=True):
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "repair.pt").write_text("the repair's progress")
        raise KeyboardInterrupt  # a stop in the repair
    assert contents(run_dir) == {"checkpoints/repair.pt": "the repair's progress"}
    assert not (run_dir / ASIDE).exists()


def test_a_resume_of_a_directory_whose_earlier_run_waits_aside_says_how_to_get_it_back(
    tmp_path: Path,
) -> None:
    """After an overwriting run was killed before its first checkpoint, ckpt_path=last said
    there was nothing to resume and to pass overwrite=true, which sets the earlier run aside
    again and removes it at the new run's first checkpoint (probe 59)."""
    from lightning_kd.training.checkpoints import resolve_ckpt_path

    run_dir = tmp_path / "run"
    finished_run(run_dir)
    set_aside(run_dir, ["checkpoints", "student", "logs", "summary.json"])  # then kill -9
    (run_dir / "logs").mkdir()
    with pytest.raises(Refused, match=r"the earlier run's outputs wait in .overwritten/: launch"):
        resolve_ckpt_path("last", run_dir / "checkpoints")
