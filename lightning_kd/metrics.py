"""Token-weighted validation metrics that reduce correctly across ranks.

Each metric keeps a sum and a token count as ``dist_reduce_fx="sum"`` states, so the value over
several ranks is Σ sums / Σ counts — the token mean of the whole validation set, not a mean of
per-rank (or per-batch) means.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
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


class ValidationMetrics(nn.Module):
    """The validation metrics of a distillation run, logged as ``val/<name>``.

    - ``ppl`` / ``teacher_ppl``: perplexity of the student / teacher on the held-out tokens
    - ``agreement``: fraction of tokens where their top-1 predictions agree
    - ``kl``: KL(teacher ‖ student) per token at T = 1
    - ``loss``: the training objective's logit terms
    - ``features``: the weighted feature-matching terms per token
    - ``embedding_cosine``: cosine of mean-pooled sentence embeddings (encoders), per example

    A metric nobody updated in an epoch is left out of :meth:`compute`.
    """

    NAMES = ("ppl", "teacher_ppl", "agreement", "kl", "loss", "features", "embedding_cosine")

    def __init__(self) -> None:
        super().__init__()
        self.metrics = nn.ModuleDict(
            {name: Perplexity() if name.endswith("ppl") else TokenMean() for name in self.NAMES}
        )

    def update(self, name: str, total: Tensor, count: Tensor | int) -> None:
        self.metrics[name].update(total, count)

    def compute(self) -> dict[str, Tensor]:
        return {
            f"val/{name}": metric.compute()
            for name, metric in self.metrics.items()
            if metric.update_called
        }

    def reset(self) -> None:
        for metric in self.metrics.values():
            metric.reset()
