"""The benchmark's driver: a scenario whose optional package is missing is skipped, saying which
extra installs it, and the report is still written (the children are stubbed: no measuring)."""

from __future__ import annotations

import json

from lightning_kd.bench import runner
from lightning_kd.cli.bench import parse
from lightning_kd.models import lora, quantize
from tests.unit.bench.test_bench import fake_report


def stub_children(monkeypatch) -> list[str]:
    """The children answer from a fake report; returns the scenarios started, as they start."""
    measured = fake_report()
    started = []

    def child(args, *extra: str):
        if extra[0] == "--scenario":
            started.append(extra[1])
            return dict(measured["scenarios"][extra[1]])
        full = extra[-1] != "--chunked"
        return [row for row in measured["loss_sweep"] if row["chunked"] != full]

    monkeypatch.setattr(runner, "child", child)
    return started


def test_scenarios_of_missing_extras_are_skipped_and_the_report_written(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(lora, "find_spec", lambda name: None)  # no peft
    monkeypatch.setattr(quantize, "find_spec", lambda name: None)  # no torchao
    started = stub_children(monkeypatch)
    report = runner.run(parse(["--out", str(tmp_path), "--device", "cpu"]))
    assert "lora" not in started and "teacher_int8" not in started
    out = capsys.readouterr().out
    assert "lora: skipped (student.lora needs the peft package" in out
    assert "pip install 'lightning-kd[lora]'" in out
    assert "pip install 'lightning-kd[quantize]'" in out
    assert report["lora_vs_full"] is None
    assert json.loads((tmp_path / "bench.json").read_text())["lora_vs_full"] is None
    assert "LoRA over" not in (tmp_path / "bench.md").read_text()


def test_an_fp64_teacher_skips_the_int8_scenario_and_the_report_is_written(
    tmp_path, monkeypatch, capsys
) -> None:
    """torchao quantizes no float64: the teacher_int8 child failed after the other scenarios
    had run, and no report was written."""
    started = stub_children(monkeypatch)
    argv = ["--out", str(tmp_path), "--device", "cpu", "--teacher-dtype", "float64"]
    runner.run(parse(argv))
    assert "teacher_int8" not in started and "teacher" in started
    out = capsys.readouterr().out
    assert "teacher_int8: skipped (--teacher-dtype float64: int8 quantizes float32," in out
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.md").is_file()


def test_a_stopped_bench_keeps_the_scenarios_it_measured(tmp_path, monkeypatch, capsys) -> None:
    """Stopped after minutes of scenarios, it wrote nothing (probe 34); a whole run leaves the
    report alone."""
    import pytest

    measured = fake_report()["scenarios"]
    order = list(measured)

    def child(args, *extra: str):
        if extra[1] == order[2]:
            raise KeyboardInterrupt  # Ctrl+C in the third scenario
        return dict(measured[extra[1]])

    monkeypatch.setattr(runner, "child", child)
    with pytest.raises(KeyboardInterrupt):
        runner.run(parse(["--out", str(tmp_path), "--device", "cpu"]))
    kept = json.loads((tmp_path / runner.PARTIAL).read_text())["scenarios"]
    assert list(kept) == order[:2] and kept[order[0]] == measured[order[0]]
    assert f"stopped: the 2 scenarios measured are in {tmp_path / runner.PARTIAL}" in (
        capsys.readouterr().out
    )
    stub_children(monkeypatch)
    runner.run(parse(["--out", str(tmp_path), "--device", "cpu"]))
    assert not (tmp_path / runner.PARTIAL).exists() and (tmp_path / "bench.json").is_file()
