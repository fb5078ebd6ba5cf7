"""A run killed mid-training and resumed from its last checkpoint continues exactly."""

from __future__ import annotations

import csv
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_cli import run_cli

COMMON = [
    "debug=smoke",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "trainer.accumulate_grad_batches=2",
    "+callbacks.checkpoint.every_n_train_steps=1",
    # a projector (64 -> 32 wide) and an identity pair: both must survive the checkpoint
    "distill.features=[{student: model.layers.1.mlp.up_proj, teacher: model.layers.3},"
    "{student: model.layers.0, teacher: model.layers.0}]",
    "validate_before=false",
]


def train_losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


LAUNCHES = {
    "one_process": [],
    # Every rank kills itself at the same step; the sampler's shards must resume where they were.
    "ddp": pytest.param(["strategy=ddp", "trainer.devices=2"], marks=pytest.mark.slow),
}


@pytest.mark.parametrize("launch", LAUNCHES.values(), ids=LAUNCHES.keys())
def test_killed_run_resumes_with_the_same_losses(tmp_path: Path, launch: list[str]) -> None:
    whole, killed, resumed = tmp_path / "whole", tmp_path / "killed", tmp_path / "resumed"
    common = [*COMMON, *launch]
    result = run_cli(*common, f"hydra.run.dir={whole}")
    assert result.returncode == 0, result.stderr[-3000:]

    kill = "+callbacks.kill={_target_: tests.helpers.KillAtStep, step: 5}"
    result = run_cli(*common, kill, f"hydra.run.dir={killed}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    checkpoint = killed / "checkpoints" / "last.ckpt"
    state = torch.load(checkpoint, weights_only=False)
    assert state["global_step"] == 5
    assert not [k for k in state["state_dict"] if k.startswith("teacher.")]
    assert "projectors.0.weight" in state["state_dict"]
    assert state["optimizer_states"] and state["lr_schedulers"]

    result = run_cli(*common, f"ckpt_path={checkpoint}", f"hydra.run.dir={resumed}")
    assert result.returncode == 0, result.stderr[-3000:]
    expected, got = train_losses(whole), train_losses(resumed)
    assert sorted(got) == [5, 6, 7], got  # steps 6..8 (logged at global_step - 1)
    for step, loss in got.items():
        assert abs(loss - expected[step]) < 1e-6, (step, loss, expected[step])
    final = load_file(whole / "student" / "model.safetensors")
    again = load_file(resumed / "student" / "model.safetensors")
    for key, value in final.items():
        torch.testing.assert_close(again[key], value, rtol=0, atol=0, msg=key)
