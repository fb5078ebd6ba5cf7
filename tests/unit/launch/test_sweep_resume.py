"""A stopped job of a ``-m`` sweep run in this process (``launch/sweep_resume.py``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_kd.launch import sweep_resume
from lightning_kd.launch.sweep_resume import sweep_note, sweep_words, unstarted_job

SWEEP = ["lightning-kd", "train", "-m", "debug=smoke", "seed=0,1,2", "hydra.sweep.dir=sw"]


@pytest.fixture
def job(monkeypatch):
    """This process as job ``num`` of a basic sweep in ``sw``."""

    def at(num: int) -> None:
        hydra = SimpleNamespace(job=SimpleNamespace(num=num), sweep=SimpleNamespace(dir="sw"))
        monkeypatch.setattr(sweep_resume, "in_basic_sweep", lambda: True)
        monkeypatch.setattr(sweep_resume.HydraConfig, "get", lambda: hydra)

    return at


def test_a_stopped_job_names_the_jobs_after_it_and_the_sweeps_command(
    job, tmp_path, monkeypatch
) -> None:
    """The stop named the running job alone; the jobs after it were not mentioned (probe 52).
    The command names the sweep directory absolute: it works from any directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sw").mkdir()
    job(0)
    note = sweep_note(["lightning-kd", "train"], SWEEP)
    assert "job 0 of the -m sweep in sw: the 2 job(s) after it did not run (job 1: seed=1; " in note
    assert "job 2: seed=2). To go on" in note
    assert note.endswith(
        f"lightning-kd train -m debug=smoke seed=0,1,2 hydra.sweep.dir={tmp_path}/sw ckpt_path=last"
    )
    job(2)
    assert sweep_note(["lightning-kd", "train"], SWEEP) == ""  # the last job: none after it
    assert sweep_words(["run.py", "-m", "seed=0,1"]) == ["-m", "seed=0,1"]


def test_the_jobs_left_are_named_by_what_tells_them_apart() -> None:
    from lightning_kd.launch.sweep_resume import jobs_named
    from lightning_kd.launch.sweeps import split_arguments

    jobs = split_arguments(["debug=smoke", "seed=0,1,2", "distill.temperature=1,2"])[0]
    assert jobs_named(jobs, 1, most=2) == (
        "job 1: seed=0 distill.temperature=2; job 2: seed=1 distill.temperature=1; and 3 more"
    )


def test_outside_a_sweep_there_is_no_note_and_every_job_is_checked() -> None:
    assert sweep_note(["lightning-kd", "train"], SWEEP) == ""
    assert not unstarted_job("last", Path("/nonexistent"))


def test_a_job_the_stopped_sweep_never_reached_starts(job, tmp_path, capsys) -> None:
    """The whole sweep launched again with ckpt_path=last resumed the jobs that had run, then
    refused the first that had not, for want of a checkpoint (probe 52)."""
    job(1)
    assert unstarted_job("last", tmp_path)
    assert "job 1 of the sweep has nothing of a run to resume: it starts" in capsys.readouterr().out
    assert not unstarted_job(None, tmp_path) and not unstarted_job("x.ckpt", tmp_path)
    (tmp_path / "checkpoints").mkdir()  # it ran: its checkpoint (or the want of one) is checked
    assert not unstarted_job("last", tmp_path)
