"""Distillation losses: pure functions of tensors, importable without Lightning."""

from lightning_kd.losses.divergences import DIVERGENCES, get_divergence
from lightning_kd.losses.logits import (
    IGNORE_INDEX,
    LossSums,
    logit_distillation_loss,
    logit_distillation_sums,
)

__all__ = [
    "DIVERGENCES",
    "IGNORE_INDEX",
    "LossSums",
    "get_divergence",
    "logit_distillation_loss",
    "logit_distillation_sums",
]
