"""Validation metrics are token-weighted, not means of per-batch means."""

from __future__ import annotations

import math

import torch

from lightning_kd.metrics import Perplexity, TokenMean


def test_token_weighted_mean() -> None:
    metric = TokenMean()
    metric.update(torch.tensor(10.0), 10)  # mean 1.0 over 10 tokens
    metric.update(torch.tensor(3.0), 1)  # mean 3.0 over 1 token
    assert math.isclose(metric.compute().item(), 13 / 11, rel_tol=1e-6)  # not (1 + 3) / 2


def test_perplexity_is_exp_of_mean_nll() -> None:
    metric = Perplexity()
    metric.update(torch.tensor(2.0 * 4), torch.tensor(4))
    assert math.isclose(metric.compute().item(), math.exp(2.0), rel_tol=1e-6)
