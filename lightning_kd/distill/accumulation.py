"""Exact loss normalisation over a gradient-accumulation window, across ranks.

Averaging per-micro-batch means weights a token by 1/(its micro-batch's token count): wrong as soon
as micro-batches hold different numbers of scored tokens (padding, masked prompts), and wrong for a
last, partial window. Instead each micro-batch back-propagates the *sum* of its per-token loss,
:class:`Window` counts the window's tokens as it goes, and :meth:`Window.rescale_gradients`
divides the accumulated gradients once by the window's total token count — over all ranks — before
the optimizer (and gradient clipping) sees them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lightning_kd.losses.logits import LogitObjective, LossSums

TERMS = ("kd", "ce", "features", "tokens", "ce_trained")
"""The window's sums: ``ce_trained`` is the CE that entered the objective (not a sampled
completion's, which ``ce`` reports too), for ``loss``."""


class Window:
    """Detached token sums of the micro-batches since the last optimizer step."""

    def __init__(self, span: bool = False) -> None:
        self.totals: Tensor | None = None
        self.teachers: tuple[str, ...] = ()
        """With several teachers, their names: each one's divergence is summed after TERMS."""
        self.span = span
        """Whether the span term (``distill.cross_span_weight``) is summed apart, after TERMS
        and before the teachers (``train/span``): set by the config, not by the batches seen,
        so every rank sums the same terms (a batch without a span adds 0)."""

    def reset(self) -> None:
        self.totals = None

    def add(self, sums: LossSums) -> None:
        """Count one micro-batch's sums into the window."""
        features = sums.features if sums.features is not None else torch.zeros_like(sums.kd)
        teachers = sums.teachers or {}
        self.teachers = tuple(teachers)
        span = [torch.zeros_like(sums.kd) if sums.span is None else sums.span] if self.span else []
        trained = sums.ce if sums.ce_trained else torch.zeros_like(sums.ce)
        parts = [sums.kd, sums.ce, features, sums.tokens.to(sums.kd), trained, *span]
        parts += teachers.values()
        counts = sums.teacher_tokens or {}
        parts += [counts.get(name, sums.tokens).to(sums.kd) for name in teachers]
        values = torch.stack([part.to(sums.kd) for part in parts]).detach().to(torch.float64)
        self.totals = values if self.totals is None else self.totals + values

    def reduced(self, strategy=None) -> dict[str, Tensor]:
        """The window's sums over every rank (a Lightning strategy's ``reduce``; this process's
        alone without one), by term name (``tokens`` included)."""
        if self.totals is None:
            raise RuntimeError("an optimizer step came with no training micro-batch in its window")
        totals = self.totals.clone()
        if strategy is not None:
            totals = strategy.reduce(totals, reduce_op="sum")
        span = ["span"] if self.span else []
        names = (*TERMS, *span, *(f"kd/{name}" for name in self.teachers))
        names += tuple(f"tokens/{name}" for name in self.teachers)
        return dict(zip(names, totals, strict=True))

    @staticmethod
    def means(totals: dict[str, Tensor], objective: LogitObjective) -> dict[str, Tensor]:
        """The window's token means of each term and of the objective it trained (``loss``:
        without the CE of sampled completions, which ``ce`` still reports); each teacher's
        divergence (``kd/<name>``) over the tokens it scored: with teachers by domain, the rows it
        teaches (over all of them, a teacher of 5 % of the tokens logged 1/20 of its divergence,
        not comparable with its ``val/kl/<name>``; probe 54)."""
        tokens = totals["tokens"].clamp(min=1)
        names = [n for n in totals if n not in ("tokens", "ce_trained") and n[:7] != "tokens/"]
        means = {name: (totals[name] / tokens).float() for name in names}
        for name in counted_teachers(totals):
            own = totals[f"tokens/{name}"].clamp(min=1)
            means[f"kd/{name}"] = (totals[f"kd/{name}"] / own).float()
        trained_ce = (totals["ce_trained"] / tokens).float()
        return {"loss": objective.combine(means["kd"], trained_ce) + means["features"], **means}

    @staticmethod
    def rescale_gradients(
        params: Iterable[nn.Parameter], tokens: Tensor, accumulate: int, world_size: int
    ) -> None:
        """Turn accumulated gradients of token sums into the gradient of the window's token mean.

        Lightning divided each micro-batch's loss by ``accumulate`` and DDP/FSDP average over
        ``world_size`` ranks; both factors are undone here, then divided by the real count.
        """
        scale = accumulate * world_size / tokens.clamp(min=1)
        for param in params:
            scale_gradient(param, scale)


def counted_teachers(totals: dict[str, Tensor]) -> list[str]:
    """The teachers a window's totals count tokens for (``tokens/<name>``), by name."""
    return [name.split("/", 1)[1] for name in totals if name.startswith("tokens/")]


def scale_gradient(param: nn.Parameter, scale: Tensor) -> None:
    """Multiply ``param``'s accumulated gradient by ``scale`` where the engine keeps it.

    Single device, DDP and FSDP keep it in ``param.grad``. DeepSpeed ZeRO-3 leaves ``param.grad``
    empty and keeps each rank's partition of it in its optimizer (scaled here, partition by
    partition: no gather); ZeRO-1/2 keep the reduced gradient in their fp32 partitions, reached
    through DeepSpeed's own accessors. A parameter with no gradient at all is left alone.
    """
    if param.grad is not None:
        param.grad.mul_(scale.to(param.grad.dtype))
    elif hasattr(param, "ds_id"):  # ZeRO-3
        from deepspeed.utils import safe_get_local_grad, safe_set_local_grad

        grad = safe_get_local_grad(param)
        if grad is not None:
            safe_set_local_grad(param, grad * scale.to(grad))
    elif hasattr(param, "_hp_mapping"):  # ZeRO-1/2
        from deepspeed.utils import safe_get_full_grad, safe_set_full_grad

        grad = safe_get_full_grad(param)
        if grad is not None:
            safe_set_full_grad(param, grad * scale.to(grad))
