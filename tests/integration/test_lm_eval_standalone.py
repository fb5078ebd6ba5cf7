"""lm-eval through the package is lm-eval: the harness's scores of a saved student on the shipped
tasks equal those the standalone ``lm_eval`` command writes for the same directory, run from
another working directory than the tasks' (their rows are found beside their YAML)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_kd.evaluation.harness import TASKS_DIR, Harness, run_tasks, scores
from tests.unit.evaluation.test_evaluate import save_tiny

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def standalone(student: Path, limit: int | None, cwd: Path, monkeypatch) -> dict:
    """``lm_eval``'s own command on ``student`` and the shipped tasks, from ``cwd``: its results
    file, read as the harness reads lm-eval's results. With a ``limit``, its entry point runs in
    this process (the command's start-up, a fresh interpreter importing torch, is most of a
    subprocess's time); without one, the command runs as users run it."""
    out = cwd / "standalone"
    arguments = ["--model", "hf", "--model_args", f"pretrained={student},dtype=float32"]
    arguments += ["--tasks", "kd_heldout", "--include_path", str(TASKS_DIR), "--device", "cpu"]
    arguments += ["--batch_size", "8", "--output_path", str(out)]
    if limit is not None:
        from lm_eval.__main__ import cli_evaluate

        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["lm_eval", *arguments, "--limit", str(limit)])
        cli_evaluate()
    else:
        finished = subprocess.run(
            [sys.executable, "-m", "lm_eval", *arguments],
            cwd=cwd,
            env={**os.environ, **OFFLINE},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert finished.returncode == 0, finished.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    return scores(json.loads(results.read_text())["results"])


# The first 8 examples of each task, lm_eval's entry point in this process, in the default tier;
# every example, lm_eval in its own process, in the slow tier.
@pytest.mark.parametrize("limit", [8, pytest.param(None, marks=pytest.mark.slow)])
def test_the_harness_equals_the_standalone_lm_eval_command(
    limit: int | None, tmp_path: Path, monkeypatch
) -> None:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    save_tiny(tmp_path / "student", seed=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    expected = standalone(tmp_path / "student", limit, elsewhere, monkeypatch)
    harness = Harness(tasks=("kd_heldout",), include=(), batch_size=8, device="cpu", limit=limit)
    measured = run_tasks(str(tmp_path / "student"), harness)

    assert set(measured) == {"kd_heldout_choice", "kd_heldout_prose"}
    assert measured.keys() == expected.keys()
    for task, metrics in expected.items():
        assert measured[task].keys() == metrics.keys()
        for metric, value in metrics.items():  # None: a stderr lm-eval does not compute
            near = value if value is None else pytest.approx(value, rel=1e-9)
            assert measured[task][metric] == near, (task, metric)
    assert set(expected["kd_heldout_choice"]) == {
        "acc",
        "acc_stderr",
        "acc_norm",
        "acc_norm_stderr",
    }
