"""Validation metrics are token-weighted, not means of per-batch means."""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from lightning_kd.training.metrics import ValidationMetrics, checked_monitors
from lightning_kd.training.saving import LastCheckpoint


def test_token_weighted_mean() -> None:
    metrics = ValidationMetrics()
    metrics.update("kl", torch.tensor(10.0), 10)  # mean 1.0 over 10 tokens
    metrics.update("kl", torch.tensor(3.0), 1)  # mean 3.0 over 1 token
    assert math.isclose(metrics.compute()["val/kl"].item(), 13 / 11, rel_tol=1e-6)  # not (1+3)/2


def test_perplexity_is_exp_of_mean_nll() -> None:
    metrics = ValidationMetrics()
    metrics.update("ppl", torch.tensor(2.0 * 4), torch.tensor(4))
    assert math.isclose(metrics.compute()["val/ppl"].item(), math.exp(2.0), rel_tol=1e-6)


def test_only_updated_metrics_are_computed_and_reset_clears_them() -> None:
    metrics = ValidationMetrics()
    assert metrics.compute() == {}
    metrics.update("agreement", torch.tensor(3.0), 4)
    metrics.update("teacher_ppl", torch.tensor(0.0), 0)  # no scored token: no figure
    values = metrics.compute()
    assert set(values) == {"val/agreement"}  # a perplexity of 1.0 measured nothing
    assert values["val/agreement"].dtype == torch.float32
    metrics.reset()
    assert metrics.compute() == {}


def test_sums_accumulate_in_fp64() -> None:
    # 2^24 + 1 is not a float32: a float32 sum would lose every one of these tokens' 1.0.
    metrics = ValidationMetrics()
    metrics.update("kl", torch.tensor(2.0**24), 1)
    for _ in range(8):
        metrics.update("kl", torch.tensor(1.0), 0)
    assert metrics.sum_list[metrics.slot["kl"]].compute().item() == 2.0**24 + 8


def test_a_non_finite_sum_shows_in_the_metric() -> None:
    metrics = ValidationMetrics()
    metrics.update("loss", torch.tensor(1.0), 1)
    metrics.update("loss", torch.tensor(math.nan), 1)
    assert math.isnan(metrics.compute()["val/loss"].item())


def test_reset_under_inference_mode_still_accepts_updates_under_no_grad() -> None:
    """``trainer.validate`` (inference mode) then ``fit``'s validation (no_grad)."""
    metrics = ValidationMetrics()
    with torch.inference_mode():
        metrics.update("ppl", torch.tensor(1.0), 1)
        metrics.compute()
        metrics.reset()
    with torch.no_grad():
        metrics.update("ppl", torch.tensor(2.0 * 3), 3)
    assert math.isclose(metrics.compute()["val/ppl"].item(), math.exp(2.0), rel_tol=1e-6)


def test_a_teachers_name_may_hold_a_dot() -> None:
    metrics = ValidationMetrics(("qwen2.5",))
    metrics.update("kl/qwen2.5", torch.tensor(3.0), 2)
    assert metrics.compute()["val/kl/qwen2.5"].item() == 1.5


def test_a_callback_monitoring_a_metric_validation_lacks_is_refused() -> None:
    """Checked on the validation before training: EarlyStopping stopped the run with a traceback
    at its first validation in training, and the resume it advised stopped there again."""
    metrics = {"val/ppl": 3.0, "val/loss": 1.1}
    assert checked_monitors([EarlyStopping(monitor="val/ppl")], metrics) is metrics
    with pytest.raises(ValueError, match=r"EarlyStopping monitors 'val/nosuch', which validation"):
        checked_monitors([EarlyStopping(monitor="val/nosuch")], metrics)
    best = LastCheckpoint("checkpoints", best="val/nosuch")  # named by the key that set it
    with pytest.raises(
        ValueError, match=r"checkpoint.best monitors 'val/nosuch', .*\(checkpoint.best=...\)"
    ):
        checked_monitors([best], metrics)


def test_the_sums_stay_fp64_when_the_module_is_cast() -> None:
    """Lightning's bf16-true casts the whole LightningModule: the sums, cast with it, stopped
    growing in bf16 (a count stuck at 65,536 tokens, a perplexity 5x too high)."""
    metrics = ValidationMetrics().to(torch.bfloat16)
    for _ in range(2000):
        metrics.update("ppl", torch.tensor(5.5 * 256), torch.tensor(256))
    assert metrics.count_list[0].sum_value.dtype == torch.float64
    assert float(metrics.count_list[0].sum_value) == 2000 * 256
    assert math.isclose(metrics.compute()["val/ppl"].item(), math.exp(5.5), rel_tol=1e-6)


def test_a_teacher_measured_on_no_token_logs_nothing_and_a_monitor_on_it_is_refused() -> None:
    """A teacher of data domains no validation row is of logged val/kl/<name> 0.0 (a count of
    0 clamped to 1): perfect agreement, on which early stopping then stopped the run (probe 27)."""
    metrics = ValidationMetrics(("tiny", "sp"))
    metrics.update("kl/tiny", torch.tensor(2.0), 4)
    metrics.update("kl/sp", torch.tensor(0.0), 0)
    computed = metrics.compute()
    assert set(computed) == {"val/kl/tiny"}
    stop = EarlyStopping(monitor="val/kl/sp")
    with pytest.raises(ValueError, match=r"monitors 'val/kl/sp'.*data domains it teaches"):
        checked_monitors([stop], {k: float(v) for k, v in computed.items()})
