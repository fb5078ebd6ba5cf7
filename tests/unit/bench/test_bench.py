"""The benchmark's report: ratios, table and plot from measured rows (the measuring itself is a
command users run, lightning-kd bench, not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_kd.bench.loss import LOSS_TOKENS, run_loss
from lightning_kd.bench.report import markdown, plot, summarise
from lightning_kd.bench.scenarios import SCENARIOS, run_scenario
from lightning_kd.cli.bench import parse
from tests.conftest import ROOT
from tests.unit.evaluation.test_evaluate import save_tiny


def fake_report():
    scenarios = {
        name: {"scenario": name, "peak_mb": 1000.0 + 100 * i, "step_s": 1.0 + i, "trainable": 1e6}
        for i, name in enumerate(SCENARIOS)
    }
    scenarios["on_policy"] |= {"sample_s": 2.5, "sampled_tokens": 60.0}
    scenarios["interleaved"] |= {"sample_s": 6.0, "sampled_tokens": 50.0}
    scenarios["two_teachers"]["teachers"] = [
        {"name": "first", "source": "online", "weights_mb": 513.0, "side_s": 0.25},
        {"name": "second", "source": "cache, cross-tokenizer", "weights_mb": 0.0, "side_s": 0.01},
    ]
    losses = [
        {"tokens": t, "chunked": c, "loss_mb": (10.0 if c else t / 10), "step_s": 0.1}
        for t in LOSS_TOKENS
        for c in (False, True)
    ]
    return summarise(scenarios, losses, parse(["--out", "x"]))


def test_ratios_are_against_floor_and_parts() -> None:
    report = fake_report()
    floor, teacher = report["scenarios"]["floor"], report["scenarios"]["teacher"]
    ours = report["scenarios"]["lightning_kd"]
    assert report["mem_ratio_vs_floor"] == pytest.approx(ours["peak_mb"] / floor["peak_mb"])
    assert report["time_ratio_vs_parts"] == pytest.approx(
        ours["step_s"] / (floor["step_s"] + teacher["step_s"])
    )
    assert report["loss_mem_ratio_vs_full"] == pytest.approx(10.0 / 819.2)
    lora = report["scenarios"]["lora"]
    assert report["lora_vs_full"]["peak_mb"] == pytest.approx(lora["peak_mb"] / ours["peak_mb"])
    free, cached = report["scenarios"]["free_floor"], report["scenarios"]["cached"]
    assert report["cached_mem_ratio_vs_free_floor"] == pytest.approx(
        cached["peak_mb"] / free["peak_mb"]
    )
    assert report["cached_time_ratio_vs_free_floor"] == pytest.approx(
        cached["step_s"] / free["step_s"]
    )
    logits, cross = report["scenarios"]["logits_only"], report["scenarios"]["cross_tokenizer"]
    assert report["cross_tokenizer_vs_logits_only"]["peak_mb"] == pytest.approx(
        cross["peak_mb"] / logits["peak_mb"]
    )
    spans = report["scenarios"]["cross_spans"]
    assert report["cross_spans_vs_cross_tokenizer"]["step_s"] == pytest.approx(
        spans["step_s"] / cross["step_s"]
    )
    two = report["scenarios"]["two_teachers"]
    assert report["second_teacher"]["step_s"] == pytest.approx(two["step_s"] - logits["step_s"])


def test_the_generation_share_is_the_sampling_over_the_on_policy_step() -> None:
    report = fake_report()
    step = report["scenarios"]["on_policy"]["step_s"]
    assert report["on_policy"]["generation_share"] == pytest.approx(2.5 / step)
    ours = report["scenarios"]["lightning_kd"]["step_s"]
    assert report["on_policy"]["step_vs_lightning_kd"] == pytest.approx(step / ours)
    step = report["scenarios"]["interleaved"]["step_s"]
    assert report["interleaved"]["generation_share"] == pytest.approx(6.0 / step)
    assert "sampling takes" in markdown(report) and "top-25 veto (50 tokens)" in markdown(report)


@pytest.mark.parametrize("name", ["on_policy", "interleaved"])
def test_the_on_policy_scenario_samples_completions_of_half_rows(
    tmp_path, name: str, monkeypatch
) -> None:
    """In-process, on a tiny saved teacher: the step runs, sampling is timed and is part of it.
    Without --quick, 3 warm-ups and the median of 3 timed steps whatever --warmup and --repeats
    say: sampled lengths vary, and one step read sampling as 4 % of the step, not 80 %. --quick,
    a check that everything runs, takes its one and one (six steps each were 20 of a --quick
    run's 32 minutes; probe 38)."""
    from lightning_kd.bench.sampling import TimedSampling, step_counts

    counted = []
    summary = TimedSampling.summary
    monkeypatch.setattr(
        TimedSampling,
        "summary",
        lambda self, repeats: (
            counted.append((len(self.seconds), repeats)) or summary(self, repeats)
        ),
    )
    save_tiny(tmp_path / "teacher", 0)
    argv = ["--scenario", name, "--teacher", str(tmp_path / "teacher"), "--quick"]
    argv += ["--device", "cpu", "--student-layers", "2", "--precision", "32-true"]
    argv += ["--teacher-dtype", "float32", "--no-compile"]
    row = run_scenario(name, parse(argv))
    # Sampling is timed inside the timed steps, so it is a part of each one: the medians keep
    # the order (timed apart, they crossed on CI on a tiny model: 0.1345 s vs 0.1340 s).
    assert 0 < row["sample_s"] < row["step_s"]
    assert 1 <= row["sampled_tokens"] <= 64  # at most half of the 128-token rows
    assert counted == [(2, 1)]  # sampled in one warm-up and one timed step, that one summarised
    full = parse([a for a in argv if a != "--quick"] + ["--warmup", "1", "--repeats", "1"])
    assert step_counts(name, full) == (3, 3) and step_counts("lightning_kd", full) == (1, 1)


@pytest.mark.parametrize(
    "name",
    [
        "floor",
        "lightning_kd",
        "free_floor",
        "cached",
        "lora",
        "cross_tokenizer",
        "cross_spans",
        "two_teachers",
    ],
)
def test_each_step_scenario_runs_on_the_default_objective(tmp_path, name: str) -> None:
    """The scenarios compose the default config (feature spans, repair settings): free_floor
    once failed there while a test on another config stayed green. In-process, tiny teacher."""
    save_tiny(tmp_path / "teacher", 0)
    argv = ["--scenario", name, "--teacher", str(tmp_path / "teacher"), "--quick"]
    argv += ["--device", "cpu", "--student-layers", "2", "--precision", "32-true"]
    argv += ["--teacher-dtype", "float32", "--no-compile"]
    row = run_scenario(name, parse(argv))
    assert row["step_s"] > 0 and row["peak_mb"] > 0 and row["trainable"] > 0
    if name == "two_teachers":  # each teacher's weights and side of the step
        assert [side["name"] for side in row["teachers"]] == ["first", "second"]
        first, second = row["teachers"]
        assert (
            first["weights_mb"] == pytest.approx(second["weights_mb"]) and first["weights_mb"] > 0
        )
        assert first["side_s"] > 0 and second["side_s"] > 0


def test_table_and_plot(tmp_path) -> None:
    report = fake_report()
    table = markdown(report)
    assert table.count("\n| ") >= len(SCENARIOS) + len(LOSS_TOKENS) * 2
    assert "mem_ratio_vs_floor" in table
    assert "| second | cache, cross-tokenizer | 0 | 0.010 |" in table
    plot(report, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").stat().st_size > 1000
    json.dumps(report)


def test_loss_measurement_runs() -> None:
    args = parse(["--out", "x", "--device", "cpu", "--loss-repeats", "1"])
    row = run_loss(512, chunked=True, args=args)
    assert row["tokens"] == 512 and row["step_s"] > 0 and row["loss_mb"] >= 0


@pytest.mark.integration  # runs the command line in a subprocess
def test_a_loss_child_measures_several_token_counts_in_rising_order() -> None:
    command = ["-m", "lightning_kd", "bench", "--loss-tokens", "64", "256", "--loss-repeats", "1"]
    result = subprocess.run(
        [sys.executable, *command, "--quick", "--device", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    assert [row["tokens"] for row in rows] == [64, 256]
    assert all(not row["chunked"] and row["loss_mb"] >= 0 for row in rows)


@pytest.mark.integration  # runs the command line in a subprocess
def test_out_is_required() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lightning_kd", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2 and "--out DIR is required" in result.stderr


def test_quick_keeps_the_values_given() -> None:
    """``--quick --seq 512`` timed 128-token rows: ``--quick`` replaced every value given."""
    quick = parse(["--scenario", "floor", "--quick", "--seq", "512", "--repeats", "3"])
    assert (quick.seq, quick.repeats, quick.warmup, quick.loss_repeats) == (512, 3, 1, 1)
    full = parse(["--scenario", "floor"])
    assert (full.seq, full.repeats, full.warmup, full.loss_repeats) == (256, 5, 2, 3)
