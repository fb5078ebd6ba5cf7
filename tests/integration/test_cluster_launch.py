"""Cluster launches from the command line: ``python run.py -m hydra/launcher=submitit_slurm ...``
writes the SLURM script Lightning's SLURM environment expects (submitted to a stand-in
``sbatch`` that keeps it), and ``hydra/launcher=submitit_local`` runs a sweep to its end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

STAND_INS = {
    # Keeps the script it is given and refuses it: nothing waits for a job that never runs.
    "sbatch": 'cp "$1" "$SBATCH_KEPT"\necho "sbatch: not submitted (a test stands in)" >&2\nexit 1',
    "srun": "exit 1",  # submitit's SLURM executor looks for srun on the PATH first
}


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``sbatch`` and ``srun`` are the stand-ins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STAND_INS.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "SBATCH_KEPT": str(tmp_path / "kept.sh")}


def launch(*overrides: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python run.py -m <overrides>``."""
    return subprocess.run(
        [sys.executable, "run.py", "-m", *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_slurm_script_for_two_nodes_of_four_devices(tmp_path: Path) -> None:
    """One task per device on each node, started by srun: what Lightning's SLURMEnvironment reads
    its ranks from (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID) and checks the trainer against
    (SLURM_NTASKS_PER_NODE == trainer.devices, SLURM_NNODES == trainer.num_nodes). A launch that
    could not run is refused before sbatch: tests/unit/launch/test_cluster.py."""
    shape = ["hydra/launcher=submitit_slurm", "trainer.num_nodes=2", "trainer.devices=4"]
    fields = ["hydra.launcher.partition=gpu", "hydra.launcher.account=kd"]
    sweep = tmp_path / "sweep"
    submitted = launch(*shape, *fields, f"hydra.sweep.dir={sweep}", env=fake_slurm(tmp_path))
    assert "sbatch: not submitted (a test stands in)" in submitted.stderr, submitted.stderr[-3000:]
    script = (tmp_path / "kept.sh").read_text()
    sbatch = set(re.findall(r"^#SBATCH (.+)$", script, re.M))
    assert {
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--partition=gpu",
        "--account=kd",
        "--time=60",
        "--signal=TERM@120",  # the run's own clean stop, before the time limit
    } <= sbatch
    (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert srun.endswith(f"-u -m submitit.core._submit {sweep}/.submitit/%j")
    assert not [path for path in sweep.iterdir() if path.name.isdigit()], "no job ran here"


@pytest.mark.slow  # two jobs of a smoke run, each a process of its own: about a minute
def test_local_launcher_runs_a_sweep_to_its_end(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    result = launch(
        "hydra/launcher=submitit_local",
        "debug=smoke",
        "seed=0,1",
        "trainer.max_steps=2",
        "validate_before=false",
        f"hydra.sweep.dir={sweep}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for number in (0, 1):
        job = sweep / str(number)  # hydra.sweep.subdir: the job's number
        assert f"seed={number}" in (job / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((job / "summary.json").read_text())["steps"] == 2
        assert (job / "student" / "model.safetensors").is_file()
    # submitit's own files sit beside the jobs' directories, not in them: each job's printout
    # (the summary table, where its run directory is) goes to its log there.
    logs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(logs) == 2
    assert all("run directory: " in log.read_text() for log in logs)
    assert not (sweep / ".submitit" / "%j").exists()  # submitit's unused placeholder, removed

    # The same launch with ckpt_path=last: a finished job refuses itself (exit 2 in its own
    # process); the launching command tells that refusal, not "stopped or killed".
    again = launch(
        "hydra/launcher=submitit_local",
        "debug=smoke",
        "seed=0",
        "trainer.max_steps=2",
        "ckpt_path=last",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=0",
    )
    assert again.returncode == 1, again.stderr[-3000:]
    told = again.stderr.strip().splitlines()
    assert told[0].startswith(
        f"lightning-kd: a job refused its run: the run in {sweep}/0 is finished"
    )
    assert told[-1].startswith(f"(its log: {sweep}/.submitit/") and told[-1].endswith("_log.err)")
