"""The benchmark exactly as docs/benchmark.md shows it: ``lightning-kd bench --quick --out DIR``
on the default config with the packaged SmolLM2 teacher (minutes: the slow tier, as is the same
command from the installed wheel on a tiny teacher in tests/integration/test_wheel.py; the default
tier runs each step scenario in-process on the default objective, tests/unit/bench/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_kd.bench.scenarios import SCENARIOS


@pytest.mark.slow
def test_the_documented_quick_benchmark_runs_every_scenario(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lightning_kd", "bench", "--quick", "--out", str(tmp_path / "b")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "b" / "bench.json").read_text())
    measured = set(report["scenarios"])
    assert measured >= set(SCENARIOS) - {"teacher_int8"}  # int8 needs torchao
    assert all(row["step_s"] > 0 and row["peak_mb"] > 0 for row in report["scenarios"].values())
    assert (tmp_path / "b" / "bench.md").is_file() and (tmp_path / "b" / "bench.png").is_file()
