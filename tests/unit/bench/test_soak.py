"""A long run does not grow: lightning-kd soak (shortened here; -m slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lightning_kd.bench.soak import MARKER, REPORT, SoakProbe, out_errors
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


class Trained(SimpleNamespace):
    """What the probe reads of a trainer and a module: the step, and no captures."""

    def __init__(self) -> None:
        super().__init__(global_step=0, distiller=SimpleNamespace(captures={}))


def test_the_soak_baseline_is_taken_at_the_warmup_step(tmp_path: Path) -> None:
    """A warm-up that is not a multiple of the probe's interval still gets its baseline (it was
    taken at the end alone, and the end compared with itself passed)."""
    probe, trained = SoakProbe(str(tmp_path / REPORT), warmup=10, every=100), Trained()
    for step in range(41):
        trained.global_step = step
        probe.on_train_batch_end(trained, trained)
    probe.on_train_end(trained, trained)
    report = json.loads((tmp_path / REPORT).read_text())
    assert sorted(map(int, report["rss_mb"])) == [10, 40]
    assert report["rss_growth"] is not None
    short = SoakProbe(str(tmp_path / REPORT), warmup=40)
    short.on_train_batch_end(trained, trained)  # step 40: the baseline is the end
    short.on_train_end(trained, trained)
    assert json.loads((tmp_path / REPORT).read_text())["rss_growth"] is None


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
