"""A ``-m`` sweep's jobs checked, each as its launcher will compose it, before any is submitted."""

from __future__ import annotations

from tests.unit.launch.test_cluster import refused_lines


def test_each_job_of_a_sweep_is_checked_before_anything_is_submitted(capsys) -> None:
    """The launch's own config holds no sweep value: seed=0,-1 was submitted, its second job to
    fail once it left the queue."""
    argv = ["-m", "hydra/launcher=submitit_slurm", "trainer.devices=1", "seed=0,-1"]
    assert refused_lines(argv, capsys)[:2] == [
        "lightning-kd: a value is refused:",
        "  job trainer.devices=1 seed=-1: seed=-1: must be an integer in [0, 4294967295]; e.g. "
        "seed=0",
    ]
