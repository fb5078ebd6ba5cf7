"""A run stopped mid-training — SIGKILL, SIGTERM, SIGINT, a crash while writing a checkpoint —
resumes from its run directory's last checkpoint and continues exactly; a run signalled in
another stage (the block-wise repair, a validation) stops there cleanly and the command it prints
resumes or starts it again."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.integration.test_cli import run_cli

COMMON = [
    "debug=smoke",
    "trainer.max_steps=8",
    "trainer.val_check_interval=2",  # optimizer steps (4 batches), each saving last.ckpt
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


SPLITS = {
    # a smaller GPU: half the micro-batch, twice the accumulation (probe 47 F27)
    "half_the_batch": ([], ["data.batch_size=2", "trainer.accumulate_grad_batches=4"]),
    # two processes of 2 blocks resumed in one of 4: the same 8 blocks a step
    "two_processes_to_one": pytest.param(
        (["strategy=ddp", "trainer.devices=2", "data.batch_size=2"], []), marks=pytest.mark.slow
    ),
}


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_a_resume_that_splits_its_steps_otherwise_continues_the_run(
    tmp_path: Path, split: tuple[list[str], list[str]]
) -> None:
    """Another micro-batch, accumulation or process count whose product is the checkpoint's
    trains the uninterrupted run's steps: the same losses and student, to rounding. Validation
    reads its whole split (debug=smoke's count of batches would be other blocks)."""
    before, after = split
    common = [*COMMON, "trainer.limit_val_batches=1.0"]
    reference, run_dir = tmp_path / "whole", tmp_path / "run"
    assert run_cli(*common, f"hydra.run.dir={reference}").returncode == 0
    kill = "+callbacks.kill={_target_: tests.helpers.KillAtStep, step: 5}"
    result = run_cli(*common, *before, kill, f"hydra.run.dir={run_dir}")
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    result = run_cli(*common, *after, "ckpt_path=last", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the same 8 blocks per optimizer step, read in other batches" in result.stdout
    uninterrupted = reference
    expected, got = train_losses(uninterrupted), train_losses(run_dir)
    assert sorted(got) == sorted(expected) == list(range(8)), got
    for step, loss in got.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step
    final = load_file(uninterrupted / "student" / "model.safetensors")
    again = load_file(run_dir / "student" / "model.safetensors")
    for key, value in final.items():
        torch.testing.assert_close(again[key], value, rtol=1e-4, atol=1e-5, msg=key)


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


def test_a_run_from_your_own_config_directory_is_told_to_resume_with_it(
    tmp_path: Path, uninterrupted: Path
) -> None:
    """Its printed command kept the overrides but not ``--config-dir``: run as printed, Hydra
    said "Could not find 'experiment/mine'". Given relative, the directory is printed absolute,
    so the command runs from anywhere."""
    experiment = tmp_path / "my_conf" / "experiment" / "mine.yaml"
    experiment.parent.mkdir(parents=True)
    experiment.write_text("# @package _global_\nvalidate_before: false\n")  # as COMMON has it
    run_dir = tmp_path / "run"
    send = "+callbacks.signal={_target_: tests.helpers.SignalAtStep, batch: 8, signal: SIGTERM}"
    launch = ["-m", "lightning_kd", "train", "--config-dir", "my_conf", *COMMON, "experiment=mine"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    stopped = subprocess.run(
        [sys.executable, *launch, send, f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    words = printed_command(stopped.stdout, "Resume with:\n")
    assert words[:6] == ["python", *launch[:4], str(experiment.parent.parent)], words
    resumed = subprocess.run(
        [sys.executable, *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
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


def printed_command(stdout: str, after: str) -> list[str]:
    """The command a stopped run printed after ``after``, minus the test's own callbacks."""
    words = shlex.split(stdout.split(after)[1].strip().splitlines()[0])
    return [w for w in words if not w.startswith(("+callbacks.signal", "+callbacks.send"))]


def run_printed(words: list[str]) -> subprocess.CompletedProcess:
    assert words[:2] == ["python", "run.py"], words
    return subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=600)


def val_steps(run_dir: Path) -> list[int]:
    with open(run_dir / "logs" / "metrics.csv") as handle:
        return [int(r["step"]) for r in csv.DictReader(handle) if r.get("val/loss")]


def test_a_signal_at_a_validation_boundary_validates_then_stops(
    tmp_path: Path, uninterrupted: Path
) -> None:
    run_dir = tmp_path / "run"
    # Micro-batch 6 opens step 4's window, which ends at a validation (every 2 steps).
    send = "+callbacks.signal={_target_: tests.helpers.SignalAtStep, batch: 6, signal: SIGTERM}"
    result = run_cli(*COMMON, send, f"hydra.run.dir={run_dir}")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "SIGTERM received: stopped after optimizer step 4" in result.stdout
    # The validations after steps 2 and 4, logged at the steps done
    assert val_steps(run_dir) == val_steps(uninterrupted)[:2], "step 4's ran before the stop"
    assert saved_step(run_dir) == 4

    resumed = run_printed(printed_command(result.stdout, "Resume with:\n"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run_dir, uninterrupted)
    assert val_steps(run_dir) == val_steps(uninterrupted) == [2, 4, 6, 8], "each once"


def test_a_signal_in_the_final_validation_keeps_the_run_resumable(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    send = "+callbacks.signal={_target_: tests.helpers.SignalInFinalValidation, signal: SIGTERM}"
    # validations at steps 3 and 6 only: the final student (step 8) is validated after fit
    common = [*COMMON, "trainer.val_check_interval=3"]
    result = run_cli(*common, send, f"hydra.run.dir={run_dir}")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "SIGTERM received: stopped during the validation" in result.stdout
    assert saved_step(run_dir) == 8
    assert not (run_dir / "student").exists() and not (run_dir / "summary.json").exists()

    resumed = run_printed(printed_command(result.stdout, "Resume with:\n"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["after"]["val/ppl"] > 0
    assert (run_dir / "student" / "model.safetensors").is_file()


def test_a_signal_one_rank_alone_gets_after_training_stops_every_rank(tmp_path: Path) -> None:
    """A validation of its own ran under Lightning's SIGTERM handler, whose notice broadcasts
    from the rank it reached: one rank signalled alone waited in it forever, and the checks
    after training asked each rank alone (probe 35: exit 137, no student)."""
    run_dir = tmp_path / "run"
    send = "+callbacks.signal={_target_: tests.helpers.SignalInFinalValidation, signal: SIGTERM"
    ddp = ["strategy=ddp", "trainer.devices=2", "validate_before=false", "export.gguf=null"]
    common = [*COMMON, "trainer.val_check_interval=3", *ddp]
    result = run_cli(*common, send + ", rank: 1}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-3000:]
    assert "Resume with:" in result.stdout and saved_step(run_dir) == 8
    assert not (run_dir / "summary.json").exists()


REPAIR_SIGNALS = {"SIGTERM": "SIGTERM", "SIGINT": pytest.param("SIGINT", marks=pytest.mark.slow)}


@pytest.mark.parametrize("name", REPAIR_SIGNALS.values(), ids=REPAIR_SIGNALS.keys())
def test_a_signal_in_the_repair_keeps_its_progress_and_the_printed_command_goes_on(
    tmp_path: Path, name: str
) -> None:
    """No training checkpoint exists in the repair: a run stopped there began it again from the
    copied layers, every time (probe 47). Its progress is kept, and the resume ends with the
    uninterrupted run's student, bit for bit."""
    run_dir, whole_dir = tmp_path / "run", tmp_path / "whole"
    repair = ["debug=smoke", "distill.blockwise_passes=2"]
    send = f"+callbacks.signal={{_target_: tests.helpers.SignalAtFitStart, signal: {name}}}"
    result = run_cli(*repair, send, f"hydra.run.dir={run_dir}")
    assert result.returncode == 128 + getattr(signal, name), result.stderr[-3000:]
    assert f"{name} received: stopped in the block-wise repair (after step 1 of" in result.stdout
    assert "the block-wise repair's progress is kept in" in result.stdout

    changed = run_cli(
        *repair[:1], "distill.blockwise_passes=3", f"hydra.run.dir={run_dir}", "ckpt_path=last"
    )
    assert changed.returncode != 0 and "holds a block-wise repair of other settings" in (
        changed.stdout + changed.stderr
    )
    again = run_printed(printed_command(result.stdout, "(the repair goes on from there):\n"))
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["blockwise"]["passes"] == 2 and summary["steps"] == 6
    assert not (run_dir / "checkpoints" / "repair.pt").exists()  # in last.ckpt now
    whole = run_cli(*repair, f"hydra.run.dir={whole_dir}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    ours, theirs = (load_file(d / "student" / "model.safetensors") for d in (run_dir, whole_dir))
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)


def test_a_resumed_run_reports_the_repair_its_student_had(tmp_path: Path) -> None:
    """The repair runs before the first step, so a resumed fit skips it: its summary said
    ``"blockwise": null`` and showed no repair row, though its student was repaired."""
    run_dir = tmp_path / "run"
    repair = ["debug=smoke", "distill.blockwise_passes=2", "checkpoint.every=2"]
    send = "+callbacks.signal={_target_: tests.helpers.SignalAtStep, batch: 3, signal: SIGTERM}"
    stopped = run_cli(*repair, send, f"hydra.run.dir={run_dir}")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    repaired = stopped.stdout.split("blockwise repair: ")[1].splitlines()[0]
    resumed = run_printed(printed_command(stopped.stdout, "Resume with:\n"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "blockwise repair: " not in resumed.stdout  # not run again
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (
        summary["blockwise"]["passes"] == 2 and f"{summary['blockwise']['steps']} steps" in repaired
    )
    assert "| block-wise repair before training |" in (run_dir / "summary.md").read_text()
