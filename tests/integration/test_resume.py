"""A run stopped mid-training — SIGKILL, SIGTERM, SIGINT, a crash while writing a checkpoint —
resumes from its run directory's last checkpoint and continues exactly."""

from __future__ import annotations

import csv
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.integration.test_cli import run_cli

COMMON = [
    "debug=smoke",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",  # batches: every 2 optimizer steps, each saving last.ckpt
    "trainer.accumulate_grad_batches=2",
    "checkpoint.every=5",
    # a projector (64 -> 32 wide) and an identity pair: both must survive the checkpoint
    "distill.features=[{student: model.layers.1.mlp.up_proj, teacher: model.layers.3},"
    "{student: model.layers.0, teacher: model.layers.0}]",
    "validate_before=false",
]


def train_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Every step's loss in ``run_dir``'s one metrics file (both parts) equals the reference's,
    and so does the final student, bit for bit."""
    expected, got = train_losses(reference), train_losses(run_dir)
    assert sorted(got) == sorted(expected) == list(range(8)), got
    for step, loss in got.items():
        assert abs(loss - expected[step]) < 1e-6, (step, loss, expected[step])
    final = load_file(reference / "student" / "model.safetensors")
    again = load_file(run_dir / "student" / "model.safetensors")
    for key, value in final.items():
        torch.testing.assert_close(again[key], value, rtol=0, atol=0, msg=key)


def saved_step(run_dir: Path) -> int:
    path = run_dir / "checkpoints" / "last.ckpt"
    return torch.load(path, weights_only=True)["global_step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    result = run_cli(*COMMON, f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


LAUNCHES = {
    "one_process": [],
    # Every rank kills itself at the same step; the sampler's shards must resume where they were.
    "ddp": pytest.param(["strategy=ddp", "trainer.devices=2"], marks=pytest.mark.slow),
}


@pytest.mark.parametrize("launch", LAUNCHES.values(), ids=LAUNCHES.keys())
def test_killed_run_resumes_with_the_same_losses(
    tmp_path: Path, launch: list[str], uninterrupted: Path
) -> None:
    reference = uninterrupted
    if launch:
        reference = tmp_path / "whole"
        result = run_cli(*COMMON, *launch, f"hydra.run.dir={reference}")
        assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "run"
    kill = "+callbacks.kill={_target_: tests.helpers.KillAtStep, step: 5}"
    result = run_cli(*COMMON, *launch, kill, f"hydra.run.dir={run_dir}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    # checkpoint.every=5: step 5's checkpoint, not only the validations' (steps 2 and 4)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 5
    assert not [k for k in state["state_dict"] if k.startswith("distiller.teacher.")]
    assert "distiller.projectors.0.weight" in state["state_dict"]
    assert state["optimizer_states"] and state["lr_schedulers"]

    result = run_cli(*COMMON, *launch, "ckpt_path=last", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(run_dir, reference)


SIGNALS = {
    "SIGTERM": "SIGTERM",
    "SIGINT": pytest.param("SIGINT", marks=pytest.mark.slow),
}


@pytest.mark.parametrize("name", SIGNALS.values(), ids=SIGNALS.keys())
def test_signalled_run_saves_exits_nonzero_and_its_printed_command_resumes(
    tmp_path: Path, name: str, uninterrupted: Path
) -> None:
    run_dir = tmp_path / "run"
    # Micro-batch 8 opens step 5's accumulation window: the run finishes that step, then stops.
    send = f"+callbacks.signal={{_target_: tests.helpers.SignalAtStep, batch: 8, signal: {name}}}"
    result = run_cli(*COMMON, send, f"hydra.run.dir={run_dir}")
    signum = getattr(signal, name)
    assert result.returncode == 128 + signum, result.stderr[-3000:]
    assert f"{name} received: stopped after optimizer step 5" in result.stdout
    assert saved_step(run_dir) == 5
    assert not (run_dir / "student").exists()

    command = result.stdout.split("Resume with:\n")[1].strip().splitlines()[0]
    words = shlex.split(command)
    assert words[:2] == ["python", "run.py"] and words[-1] == "ckpt_path=last"
    # the printed command, minus the test's signal callback
    words = [w for w in words[2:] if not w.startswith("+callbacks.signal")]
    resumed = subprocess.run(
        ["python", "run.py", *words], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, uninterrupted)


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(
    tmp_path: Path, uninterrupted: Path
) -> None:
    run_dir = tmp_path / "run"
    crash = "+callbacks.crash={_target_: tests.helpers.KillDuringCheckpointWrite, step: 6}"
    result = run_cli(*COMMON, crash, f"hydra.run.dir={run_dir}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    leftovers = list((run_dir / "checkpoints").glob(".last.ckpt.*.partial"))
    assert leftovers and leftovers[0].stat().st_size > 0, "killed mid-write"
    assert saved_step(run_dir) == 5  # the previous checkpoint, whole and loadable

    result = run_cli(*COMMON, "ckpt_path=last", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(run_dir, uninterrupted)
