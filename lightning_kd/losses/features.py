"""Feature-matching losses between captured student and teacher activations.

Each loss maps ``[..., dim]`` student and teacher features to one value per position; the caller
sums it over the positions it scores (the same positions as the logit losses, so gradient
accumulation stays exact) and divides by the same token count.

- ``mse``     mean over the feature dim of (s − t)²
- ``l1``      mean over the feature dim of |s − t|
- ``cosine``  1 − cos(s, t): scale-free, so it suits residual streams whose norm grows with depth
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.logits import math_dtype

FeatureLoss = Callable[[Tensor, Tensor], Tensor]


def mse(student: Tensor, teacher: Tensor) -> Tensor:
    """Per-position mean squared error over the feature dimension."""
    return (student - teacher).pow(2).mean(-1)


def l1(student: Tensor, teacher: Tensor) -> Tensor:
    """Per-position mean absolute error over the feature dimension."""
    return (student - teacher).abs().mean(-1)


def cosine(student: Tensor, teacher: Tensor) -> Tensor:
    """Per-position cosine distance 1 − cos(s, t)."""
    return 1.0 - F.cosine_similarity(student, teacher, dim=-1, eps=1e-8)


FEATURE_LOSSES: dict[str, FeatureLoss] = {"mse": mse, "l1": l1, "cosine": cosine}


def get_feature_loss(name: str) -> FeatureLoss:
    """The feature loss registered as ``name``, or a ValueError naming the choices."""
    if name not in FEATURE_LOSSES:
        raise ValueError(f"unknown feature loss {name!r}; choose one of {sorted(FEATURE_LOSSES)}")
    return FEATURE_LOSSES[name]


def masked_feature_sum(student: Tensor, teacher: Tensor, mask: Tensor, loss: FeatureLoss) -> Tensor:
    """Σ over positions where ``mask`` is true of ``loss(student, teacher)``, in fp32 (or fp64).

    ``student``/``teacher`` are ``[batch, seq, dim]``, ``mask`` ``[batch, seq]``; padded positions
    are left out entirely, so their (meaningless) activations cannot move the loss.
    """
    if student.shape != teacher.shape:
        raise ValueError(
            f"feature shapes differ: student {tuple(student.shape)} vs teacher "
            f"{tuple(teacher.shape)}; a projector must map the student's width to the teacher's"
        )
    dtype = math_dtype(student.dtype)
    return loss(student[mask].to(dtype), teacher[mask].to(dtype)).sum()


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Sentence embeddings ``[batch, dim]``: the mean of ``hidden`` over attended positions
    (the pooling of sentence-transformers models such as all-MiniLM-L6-v2)."""
    weights = attention_mask.unsqueeze(-1).to(math_dtype(hidden.dtype))
    return (hidden.to(weights.dtype) * weights).sum(1) / weights.sum(1).clamp(min=1)
