"""A ``-m`` sweep's jobs checked, each as its launcher will compose it, before any is submitted."""

from __future__ import annotations

import pytest

from lightning_kd.launch.nodes import several_processes
from tests.unit.launch.test_cluster import refused_lines

pytestmark = pytest.mark.usefixtures("slurm_client")  # judged as on a login node


def test_each_job_of_a_sweep_is_checked_before_anything_is_submitted(capsys) -> None:
    """The launch's own config holds no sweep value: seed=0,-1 was submitted, its second job to
    fail once it left the queue."""
    argv = ["-m", "hydra/launcher=submitit_slurm", "trainer.devices=1", "seed=0,-1"]
    argv.append("hydra.sweep.dir=/shared/runs/seeds")
    assert refused_lines(argv, capsys)[:2] == [
        "lightning-kd: a value is refused:",
        "  job trainer.devices=1 seed=-1: seed=-1: must be an integer in [0, 4294967295]; e.g. "
        "seed=0",
    ]


def test_a_sweep_run_in_this_process_refuses_jobs_of_several_processes(capsys) -> None:
    """Lightning starts a DDP job's other processes by running the command again, the whole
    sweep: they ran the other jobs too, and the rank variables they left failed the next job
    (`LOCAL_RANK=1 in the environment`) or made it wait forever."""
    argv = ["-m", "seed=0,1", "trainer.devices=2", "strategy=ddp", "debug=smoke"]
    (line,) = [line for line in refused_lines(argv, capsys) if line.startswith("  job ")]
    assert "a -m sweep of 2 jobs with a job of several processes" in line
    assert "Run each job as its own command" in line
    # One job of two processes is the command itself; a sweep of one-process jobs runs here.
    assert several_processes(2, 1) and several_processes("0,1", 1) and several_processes(1, 2)
    assert not several_processes(1, 1) and not several_processes("1", 1)
