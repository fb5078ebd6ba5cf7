"""Token-weighted validation metrics that reduce correctly across ranks.

Each metric keeps a sum and a token count as ``dist_reduce_fx="sum"`` states, so the value over
several ranks is Σ sums / Σ counts — the token mean of the whole validation set, not a mean of
per-rank (or per-batch) means.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class TokenMean(Metric):
    """Mean of a per-token quantity over all tokens seen (on every rank)."""

    full_state_update = False
    higher_is_better: bool | None = None

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state(
            "total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
        )
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, total: Tensor, count: Tensor | int) -> None:
        """Add a sum over ``count`` tokens."""
        # Out of place: states reset under ``trainer.validate``'s inference mode are inference
        # tensors, which refuse in-place updates during ``fit``'s (no_grad) validation.
        self.total = self.total + total.detach().to(torch.float64)
        self.count = self.count + count

    def compute(self) -> Tensor:
        return (self.total / self.count.clamp(min=1)).float()


class Perplexity(TokenMean):
    """exp of the token-mean negative log-likelihood."""

    higher_is_better = False

    def compute(self) -> Tensor:
        return super().compute().exp()
