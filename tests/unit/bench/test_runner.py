"""The benchmark's driver: a scenario whose optional package is missing is skipped, saying which
extra installs it, and the report is still written (the children are stubbed: no measuring)."""

from __future__ import annotations

import json

from lightning_kd.bench import runner
from lightning_kd.cli.bench import parse
from lightning_kd.models import lora, quantize
from tests.unit.bench.test_bench import fake_report


def test_scenarios_of_missing_extras_are_skipped_and_the_report_written(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(lora, "find_spec", lambda name: None)  # no peft
    monkeypatch.setattr(quantize, "find_spec", lambda name: None)  # no torchao
    measured = fake_report()
    started = []

    def child(args, *extra: str):
        if extra[0] == "--scenario":
            started.append(extra[1])
            return dict(measured["scenarios"][extra[1]])
        full = extra[-1] != "--chunked"
        return [row for row in measured["loss_sweep"] if row["chunked"] != full]

    monkeypatch.setattr(runner, "child", child)
    report = runner.run(parse(["--out", str(tmp_path), "--device", "cpu"]))
    assert "lora" not in started and "teacher_int8" not in started
    out = capsys.readouterr().out
    assert "lora: skipped (student.lora needs the peft package" in out
    assert "pip install 'lightning-kd[lora]'" in out
    assert "pip install 'lightning-kd[quantize]'" in out
    assert report["lora_vs_full"] is None
    assert json.loads((tmp_path / "bench.json").read_text())["lora_vs_full"] is None
    assert "LoRA over" not in (tmp_path / "bench.md").read_text()
