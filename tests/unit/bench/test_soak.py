"""A long run does not grow: lightning-kd soak (shortened here; -m slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_kd.bench.soak import MARKER, REPORT, out_errors
from tests.conftest import ROOT


@pytest.mark.slow
def test_a_soak_keeps_memory_flat_and_no_capture(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    command = [sys.executable, "-m", "lightning_kd", "soak", "--steps", "300", "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    print(result.stdout)
    report = json.loads((out / "soak.json").read_text())
    assert report["steps"] == 300 and sorted(map(int, report["rss_mb"])) == [100, 200, 300]
    assert report["captures_retained"] == 0
    assert report["rss_growth"] < 0.01, report
    assert result.returncode == 0 and "PASS" in result.stdout, result.stderr[-3000:]


def test_a_soak_reuses_only_a_directory_it_marked(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    assert out_errors(out) == []  # new: the soak creates it
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(b"")
    (out / REPORT).write_text("{}")
    (error,) = out_errors(out)
    assert f"--out {out} holds outputs a soak did not write (checkpoints, soak.json)" in error
    (out / MARKER).touch()  # what a soak leaves: its own outputs, replaced by the next soak
    assert out_errors(out) == []
