"""Faults through the real command line: refused up front, or stopped with a clear message."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tests.integration.test_cli import run_cli, run_in_process


def test_bad_inputs_are_refused_before_anything_loads(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    cases = {
        "ckpt_path=http://127.0.0.1:9/x.ckpt": "is a URL; only local checkpoint files are loaded",
        f"ckpt_path={empty}": f"checkpoint {empty} is empty (0 bytes)",
        "distill.temperature=nan": "distill.temperature=nan: must be a finite number >= 0.01",
        "trainer.limit_val_batches=0": "trainer.limit_val_batches=0: must be an integer >= 1",
        "data.files=[]": "data.files is empty",
    }
    for number, override in enumerate(cases):  # in this process: a start-up each cost most
        run_dir = tmp_path / str(number)
        argv = ["train", "debug=smoke", override, f"hydra.run.dir={run_dir}"]
        code, output = run_in_process(argv, capsys)
        assert code not in (0, None), override
        assert cases[override] in output, (override, output[-2000:])
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "logs").exists()


def test_a_diverging_run_stops_keeps_its_finite_checkpoint_and_exports_nothing(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    result = run_cli(
        "debug=smoke", "optimizer.lr=1e30", "checkpoint.every=1", f"hydra.run.dir={run_dir}"
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    # lr=1e30: step 1 is finite, its update overflows the weights, step 2 is caught
    assert re.search(r"NonFiniteError: .* not finite (at|after) optimizer step 2", output), output
    assert "The latest checkpoint is" in output and "(optimizer step 1)" in output
    assert (
        "Resume with a tenth of the learning rate (lower it further if it diverges again) "
        "and a fresh optimizer:" in output
    )
    assert "optimizer.lr=1e+29 resume_reset_optimizer=true" in output and "Traceback" not in output
    assert not (run_dir / "student").exists() and not (run_dir / "summary.json").exists()
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 1
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())
