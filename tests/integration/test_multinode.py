"""Two nodes of one process each, started by torchrun as on two machines (gloo, a localhost
rendezvous, one shared run directory), train the student one process trains; one node killed
mid-run, both restarted with ckpt_path=last, continue as the uninterrupted run. A node whose
other node never starts can be stopped while it waits."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lightning_kd.training.rundir import run_outputs
from tests.conftest import ROOT
from tests.integration.test_cli import run_cli
from tests.unit.training.test_ddp import common, documents
from tests.unit.training.test_strategies import free_port
from tests.unit.utils.test_stopping import signalled_once_ready

NODES = 2


def torchrun_nodes(
    *overrides: str, port: int, own: tuple[tuple[str, ...], ...] = ((), ())
) -> list[subprocess.CompletedProcess]:
    """``torchrun --nnodes=2 --nproc-per-node=1 --node-rank=i run.py ...`` for each node i, as
    each machine's user would type it, run side by side; each node in its own session (its
    torchrun agent and the worker it starts), as on its own machine. ``own``: each node's own
    further overrides."""
    launches = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run"),
                f"--nnodes={NODES}",
                "--nproc-per-node=1",
                f"--node-rank={rank}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "run.py",
                "strategy=ddp",
                f"trainer.num_nodes={NODES}",
                "trainer.devices=1",
                *overrides,
                *own[rank],
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(NODES)
    ]
    finished = []
    for launch in launches:
        try:
            out, err = launch.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for other in launches:
                os.killpg(other.pid, signal.SIGKILL)
            raise
        finished.append(subprocess.CompletedProcess(launch.args, launch.returncode, out, err))
    return finished


def train_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def assert_same_student(run_dir: Path, reference: Path, rtol: float) -> None:
    want = load_file(reference / "student" / "model.safetensors")
    got = load_file(run_dir / "student" / "model.safetensors")
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=rtol, atol=rtol * 1e-3, msg=key)


@pytest.mark.slow
def test_two_nodes_equal_one_process_and_resume_after_a_node_is_killed(tmp_path: Path) -> None:
    data = documents(tmp_path / "docs.jsonl")
    # 6 optimizer steps of 3 micro-batches; last.ckpt at step 3, where node 1 dies.
    shared = [o for o in common(data, 2) if not o.startswith("trainer.max_steps=")]
    shared += ["trainer.max_steps=6", "checkpoint.every=3"]
    one, two, killed = tmp_path / "one", tmp_path / "two", tmp_path / "killed"

    result = run_cli(*shared, "data.batch_size=4", f"hydra.run.dir={one}")
    assert result.returncode == 0, result.stderr[-3000:]
    nodes = torchrun_nodes(*shared, f"hydra.run.dir={two}", port=free_port())
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    summary_one = json.loads((one / "summary.json").read_text())
    summary_two = json.loads((two / "summary.json").read_text())
    assert summary_one["steps"] == summary_two["steps"] == 6
    assert summary_one["train_tokens"] == summary_two["train_tokens"] > 0
    assert_same_student(two, one, rtol=1e-9)
    # Token sums over both nodes' shares. Lightning collects logged values in float32 (its
    # result metrics take the default dtype): fp64 sums that differ in their last digits can
    # round to neighbouring float32 values, one float32 step (1.2e-7 relative) apart.
    for name, value in summary_one["after"].items():
        assert summary_two["after"][name] == pytest.approx(value, rel=2.5e-7), name
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in nodes[1].stderr

    # Node 1 dies (SIGKILL) as step 3 begins; node 0 loses its peer in the step's all-reduce.
    kill = "+callbacks.kill={_target_: tests.helpers.KillAtStep, step: 3, rank: 1}"
    nodes = torchrun_nodes(*shared, kill, f"hydra.run.dir={killed}", port=free_port())
    assert all(node.returncode != 0 for node in nodes), [node.returncode for node in nodes]
    state = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 3
    assert not (killed / "summary.json").exists()
    # Node 0 names the lost peer's failure and how to resume: on every node, through torchrun.
    resume = nodes[0].stdout.split("resume with, on every node, through torchrun as before:\n")
    assert len(resume) == 2 and "ckpt_path=last" in resume[1], nodes[0].stdout[-3000:]

    nodes = torchrun_nodes(*shared, "ckpt_path=last", f"hydra.run.dir={killed}", port=free_port())
    for node in nodes:
        assert node.returncode == 0, node.stderr[-3000:]
    expected, got = train_losses(two), train_losses(killed)
    assert sorted(got) == sorted(expected) == list(range(6)), got
    for step, loss in got.items():
        assert loss == pytest.approx(expected[step], rel=1e-12), step
    assert_same_student(killed, two, rtol=1e-12)


@pytest.mark.slow
def test_nodes_given_different_settings_are_refused_before_the_first_step(tmp_path: Path) -> None:
    """Another seed on one node trained overlapping shards to exit 0; other data files hung both
    nodes in the first validation until they were killed."""
    shared = ["debug=smoke", "export.gguf=null", "distill.teacher_cache=null"]
    for own, named in [
        (("seed=0",), ("seed=1",)),
        ((), (f"data.files=[{documents(tmp_path / 'docs.jsonl')}]",)),
    ]:
        run = (f"hydra.run.dir={tmp_path / 'run'}", "overwrite=true")
        nodes = torchrun_nodes(*shared, *run, port=free_port(), own=(own, named))
        refused = "the processes of the run were given different settings: " + named[0][:4]
        for node in nodes:
            said = node.stdout + node.stderr
            assert node.returncode != 0 and refused in said, said[-3000:]
            assert "process 0 has" in said and "Start the same command" in said


def srun_task_of_two(rank: int, port: int) -> dict[str, str]:
    """The environment ``srun`` gives task ``rank`` of a 2-node job of one task per node."""
    job = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "kd", "SLURM_STEP_ID": "0"}
    job |= {"SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1"}
    task = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank)}
    where = {"SLURM_NODELIST": "localhost", "MASTER_PORT": str(port)}
    return {**os.environ, **job, **task, **where}


NODES_OF_ONE = ("trainer.num_nodes=2", "trainer.devices=1")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_node_waiting_for_one_that_never_joins_stops_at_once_on_a_signal(
    tmp_path: Path, signum: int
) -> None:
    """Node 0 of two, whose other node never starts, waits in the process group's set-up (in
    torch's C++ store, where no Python handler runs): a scheduler's SIGTERM or a Ctrl+C ends it
    at once, saying so (both did nothing: it waited out the store's 30 minutes)."""
    run_dir = tmp_path / "run"
    node = subprocess.Popen(
        [
            sys.executable,
            "run.py",
            "debug=smoke",
            "strategy=ddp",
            *NODES_OF_ONE,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        env=srun_task_of_two(rank=0, port=free_port()),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = signalled_once_ready(node, lambda line: "MEMBER: 1/2" in line, signum)
    assert node.returncode == 128 + signum, out
    name = signal.Signals(signum).name
    assert (
        f"{name} received while process 0 waited for the other processes of the run to join "
        "(2 processes: trainer.num_nodes=2 x trainer.devices=1): stopped at once"
    ) in out
    assert not run_outputs(run_dir), "nothing was written: the same command starts again"
