"""What a run does when its numbers stop being finite: stop, name the step, keep nothing non-finite.

A non-finite training loss stops the run before its optimizer step (so the weights are still
those of the last finite step); a checkpoint or an export of non-finite weights is refused; and
the summary writes a non-finite figure as ``null``, which strict JSON parsers accept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or an infinity; the message names the step and the culprit.
    ``lower_rate``: whether a smaller learning rate is the way on (the stop report then prints
    the command with one; ``launch/stop_report.py``), not another divergence."""

    def __init__(self, message: str, lower_rate: bool = True) -> None:
        super().__init__(message)
        self.lower_rate = lower_rate


def check_finite_loss(step: int, parts: Mapping[str, Tensor | float]) -> None:
    """Raise :class:`NonFiniteError` if any of the loss ``parts`` of optimizer ``step`` is not
    finite, naming each part's value (so the diverging term is visible)."""
    values = {name: float(value) for name, value in parts.items()}
    if all(math.isfinite(value) for value in values.values()):
        return
    shown = ", ".join(f"{name}={value:.6g}" for name, value in values.items())
    others = [value for name, value in values.items() if name not in ("kd", "loss")]
    if values.get("kd") == math.inf and all(math.isfinite(value) for value in others):
        raise NonFiniteError(  # the divergence itself, not a diverging run
            f"the KD term alone is infinite at optimizer step {step} ({shown}): reverse_kl, and "
            "jsd at distill.beta=1, are infinite where the teacher gives a token probability 0 "
            "(a logit of -inf: a masked vocabulary entry) and the student does not. Use "
            "distill.divergence=forward_kl, or jsd with distill.beta below 1",
            lower_rate=False,
        )
    if math.isnan(values.get("kd", 0.0)) and math.isfinite(values.get("ce", math.nan)):
        raise NonFiniteError(  # the student's own logits are finite: its CE is (probe 47)
            f"the KD term alone is NaN at optimizer step {step} ({shown}), the student's CE "
            "finite: the teacher's distribution holds a NaN (its logits in teacher.dtype "
            "float16 overflowing, a quantized teacher, a damaged teacher cache). A lower "
            "learning rate cannot help: check the teacher (teacher.dtype=float32 or bfloat16, "
            "or its cache written again)",
            lower_rate=False,
        )
    raise NonFiniteError(
        f"the training loss is not finite at optimizer step {step} ({shown}); the run stops "
        "before applying it. Lower optimizer.lr, or check distill.temperature and the loss "
        "weights"
    )


STUDENT_FIGURES = ("val/loss", "val/ppl", "val/bpb")
"""The final validation's figures of the student itself (not the teacher's, not a divergence)."""


def check_finite_validation(after: Mapping[str, float], step: int) -> None:
    """Raise :class:`NonFiniteError` where the final validation's figures of the student are not
    finite: a run whose last measurement was NaN (early stopping on a NaN validation) ended
    with exit 0 and its student exported (probe 47). Its weights were finite (checked at each
    save), so its forward overflows or divides by zero: not a rate to lower."""
    bad = {key: after[key] for key in STUDENT_FIGURES if not math.isfinite(after.get(key, 0.0))}
    if bad:
        shown = ", ".join(f"{key}={value}" for key, value in bad.items())
        raise NonFiniteError(
            f"the final validation of the student is not finite at optimizer step {step} "
            f"({shown}): it is not exported. Its weights are finite, so its forward overflows "
            "in validation: try trainer.precision=32-true (16-mixed overflows past 65504), or "
            "check the validation data",
            lower_rate=False,
        )


def non_finite_parameters(named: Iterable[tuple[str, nn.Parameter]]) -> list[str]:
    """Names of the parameters holding a NaN or an infinity."""
    return [name for name, p in named if p.numel() and not bool(torch.isfinite(p).all())]


def check_finite_model(model: nn.Module, what: str, step: int | None = None) -> None:
    """Raise :class:`NonFiniteError` if ``model`` has a non-finite trainable weight."""
    bad = non_finite_parameters((n, p) for n, p in model.named_parameters() if p.requires_grad)
    if bad:
        at = f" after optimizer step {step}" if step is not None else ""
        raise NonFiniteError(
            f"{len(bad)} weights of the student are not finite{at} (e.g. {bad[:3]}): {what} "
            "is refused; lower optimizer.lr"
        )


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value
