"""A cluster job prints the ``-m`` command that resumes it where it ran; a cluster launch needs
``hydra.sweep.dir`` to be resumable; a job that did not finish is told in a line naming its log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from submitit.core.utils import FailedJobError, UncompletedJobError

from lightning_kd.cli.hydra_command import LaunchCheck, run_hydra
from lightning_kd.launch.cluster_jobs import (
    job_end_message,
    job_ends_told,
    job_refusal,
    job_rerun,
    launcher_errors_passed,
)
from tests.unit.launch.test_cluster import composed

UNCOMPLETED = (
    "Job 17444 (task: 0) with path /shared/sw/.submitit/17444/17444_0_result.pkl\n"
    "has not produced any output (state: FINISHED)\nError stream produced:\n----\nSeed set to 0"
)


def test_a_cluster_launch_without_a_sweep_directory_is_refused(capsys) -> None:
    """Hydra's default, multirun/<date>/<time>, is another each launch: the documented resume,
    the same command with ckpt_path=last, found no checkpoint there."""
    for launcher in ("submitit_slurm", "submitit_local"):
        devices = "trainer.devices=1"
        with pytest.raises(SystemExit) as exit_:
            LaunchCheck().on_multirun_start(config=composed(f"hydra/launcher={launcher}", devices))
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "a cluster launch without hydra.sweep.dir: its jobs would write under" in err
        assert "e.g. hydra.sweep.dir=/shared/runs/my-sweep" in err
    LaunchCheck().on_multirun_start(
        config=composed("hydra/launcher=submitit_local", "hydra.sweep.dir=/tmp/s", "debug=smoke")
    )


def as_job(mode: str) -> None:
    """Hydra's config of a SLURM sweep's job 3 in ``/shared/sw``, run in ``mode``."""
    cfg = composed("hydra/launcher=submitit_slurm", "trainer.devices=1")
    with open_dict(cfg):
        cfg.hydra.mode = mode
        cfg.hydra.overrides.hydra = [
            "hydra/launcher=submitit_slurm",
            "hydra.launcher.partition=gpu",
            "hydra.sweep.dir=/shared/sw",
            "hydra.mode=MULTIRUN",
        ]
        cfg.hydra.sweep.subdir = "3"
    HydraConfig.instance().set_config(cfg)


def test_a_job_is_resumed_by_the_launch_of_that_job_into_its_directory() -> None:
    """Without ``-m`` and its launcher the printed command ran the job on the login node."""
    task = ["seed=1", "trainer.devices=1", "overwrite=true"]
    try:
        as_job("MULTIRUN")
        resume = job_rerun(["lightning-kd", "train"], task, Path("/shared/sw/3"), "ckpt_path=last")
        assert resume == (
            "lightning-kd train -m hydra/launcher=submitit_slurm hydra.launcher.partition=gpu "
            "seed=1 trainer.devices=1 hydra.sweep.dir=/shared/sw hydra.sweep.subdir=3 "
            "ckpt_path=last"
        )
        as_job("RUN")
        assert job_rerun(["lightning-kd", "train"], task, Path("/r")) is None  # a plain run
    finally:
        HydraConfig.instance().cfg = None


def test_a_job_that_did_not_finish_is_told_in_a_line_naming_its_log(capsys) -> None:
    assert job_end_message(UncompletedJobError(UNCOMPLETED)) == (
        "a job ended without a result (state FINISHED): it was stopped (SIGTERM at its time "
        "limit, scancel) or killed. Its printout is /shared/sw/.submitit/17444/17444_0_log.out; "
        "a stopped run's ends with the command that resumes it"
    )
    failed = FailedJobError(
        "Job (task=0) failed during processing with trace:\n----\nValueError: x\n----\n"
        "or at paths:\n  - /s/.submitit/9/9_0_log.err\n  - /s/.submitit/9/9_0_log.out"
    )
    assert job_end_message(failed) == (
        "a job failed: its error ends /s/.submitit/9/9_0_log.err "
        "(its printout: /s/.submitit/9/9_0_log.out)"
    )

    # Hydra passes the launcher's error on within a submitit launch; the command tells it.
    with launcher_errors_passed(["-m", "hydra/launcher=submitit_slurm", "seed=0"]):
        assert os.environ["HYDRA_FULL_ERROR"] == "1"
    assert "HYDRA_FULL_ERROR" not in os.environ
    with launcher_errors_passed(["-m", "seed=0,1"]):  # the basic launcher: Hydra's own report
        assert "HYDRA_FULL_ERROR" not in os.environ


def test_a_job_that_refused_its_run_is_told_by_its_refusal(tmp_path: Path) -> None:
    """A job exiting 2 leaves no result, as a killed one does: it was told as "stopped or
    killed", naming a stdout log that does not hold the refusal."""
    job = tmp_path / ".submitit" / "28521"
    job.mkdir(parents=True)
    (tmp_path / ".submitit" / "%j").mkdir()  # submitit's folder setting, made as written
    (job / "28521_0_log.err").write_text(
        "Seed set to 0\nlightning-kd: 2 values are refused:\n  seed=-1: give a seed >= 0\n"
        "  trainer.max_steps=0: give a number >= 1\n"
    )
    text = UNCOMPLETED.replace("/shared/sw/.submitit/17444/17444", str(job / "28521"))
    assert job_end_message(UncompletedJobError(text)) == (
        "a job refused its run: 2 values are refused:\n  seed=-1: give a seed >= 0\n"
        f"  trainer.max_steps=0: give a number >= 1\n(its log: {job}/28521_0_log.err)"
    )
    with pytest.raises(SystemExit), job_ends_told(["-m", "hydra/launcher=submitit_local"]):
        raise UncompletedJobError(text)
    assert not (tmp_path / ".submitit" / "%j").exists()  # the unused placeholder goes
    assert job.is_dir()


def test_a_further_tasks_refusal_is_read_from_its_log(tmp_path: Path) -> None:
    """A task other than the first says which it is before the refusal's first line."""
    log = tmp_path / "28521_1_log.err"
    log.write_text("[rank: 1] lightning-kd: 1 value is refused:\n  seed=-1: give a seed >= 0\n")
    assert job_refusal(log) == "1 value is refused:\n  seed=-1: give a seed >= 0"


def test_the_launching_command_ends_with_that_line(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")  # as within a submitit launch

    def uncompleted(cfg) -> None:
        raise UncompletedJobError(UNCOMPLETED)

    with pytest.raises(SystemExit) as exit_:
        run_hydra(uncompleted, ["debug=smoke", f"hydra.run.dir={tmp_path}/run"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err  # (a run's own "Error executing job" line: not a launch's)
    assert err.splitlines()[-1].startswith("lightning-kd: a job ended without a result")
    assert "Traceback" not in err
