"""Per-token divergences between a student's and a teacher's next-token distributions.

Every function here takes log-probabilities ``student_logp`` and ``teacher_logp`` of shape
``[..., vocab]`` (already temperature-scaled, in fp32) and returns one value per token, shape
``[...]``. They are pure tensor functions so that anyone can check them against another
implementation. Mixtures are formed in log space with ``logsumexp``, and ``p * log(p / q)`` is taken
as 0 where ``p == 0``, so no ``log(0)`` turns into a NaN.

Conventions (the same as TRL's ``generalized_jsd_loss`` and DistiLLM, so numbers can be compared):

- ``forward_kl``  KL(teacher ‖ student) = Σ p_t (log p_t − log p_s)  — mean-seeking; the usual KD.
- ``reverse_kl``  KL(student ‖ teacher) = Σ p_s (log p_s − log p_t)  — mode-seeking (MiniLLM).
- ``jsd``         generalised Jensen–Shannon with mixture m = β p_t + (1 − β) p_s:
                  β KL(teacher ‖ m) + (1 − β) KL(student ‖ m). β = 0.5 is the symmetric JSD.
                  As in TRL, β = 0 is defined as forward KL and β = 1 as reverse KL (the limits of
                  the formula itself vanish there).
- ``skew_kl``     skew forward KL (DistiLLM): KL(teacher ‖ α p_t + (1 − α) p_s), α = ``skew``.
                  α = 0 is forward KL; a small α (0.1) bounds the loss where p_s ≈ 0.
- ``tvd``         total variation distance ½ Σ |p_t − p_s|.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

TokenDivergence = Callable[[Tensor, Tensor], Tensor]
"""(student_logp, teacher_logp) -> per-token divergence, both inputs ``[..., vocab]``; in
practice a :class:`Divergence`."""


def _kl(logp: Tensor, logq: Tensor) -> Tensor:
    """KL(p ‖ q) over the last dim from log-probabilities; terms with p == 0 contribute 0."""
    p = logp.exp()
    # Zero both logs where p == 0 (rather than masking the product afterwards): a masked
    # 0 · (−inf) still turns into a NaN gradient in backward.
    absent = p == 0
    return (p * (logp.masked_fill(absent, 0.0) - logq.masked_fill(absent, 0.0))).sum(-1)


def _log_mixture(logp: Tensor, logq: Tensor, weight_p: float) -> Tensor:
    """log(w p + (1 − w) q), computed in log space. A token both rule out (−inf in both) is
    −inf, without going through ``logaddexp(−inf, −inf)``, whose gradient is NaN (0 · NaN) even
    where the KL after it masks the token: it made every gradient of the row NaN."""
    both = torch.isneginf(logp) & torch.isneginf(logq)
    mixed = torch.logaddexp(
        logp.masked_fill(both, 0.0) + math.log(weight_p),
        logq.masked_fill(both, 0.0) + math.log1p(-weight_p),
    )
    return mixed.masked_fill(both, float("-inf"))


def forward_kl(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """KL(teacher ‖ student) per token."""
    return _kl(teacher_logp, student_logp)


def reverse_kl(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """KL(student ‖ teacher) per token."""
    return _kl(student_logp, teacher_logp)


def jsd(student_logp: Tensor, teacher_logp: Tensor, beta: float = 0.5) -> Tensor:
    """Generalised JSD per token with mixture m = β p_t + (1 − β) p_s (TRL's convention)."""
    if beta == 0.0:
        return forward_kl(student_logp, teacher_logp)
    if beta == 1.0:
        return reverse_kl(student_logp, teacher_logp)
    log_mix = _log_mixture(teacher_logp, student_logp, beta)
    return beta * _kl(teacher_logp, log_mix) + (1.0 - beta) * _kl(student_logp, log_mix)


def skew_kl(student_logp: Tensor, teacher_logp: Tensor, skew: float = 0.1) -> Tensor:
    """Skew forward KL per token: KL(teacher ‖ α p_t + (1 − α) p_s), α = ``skew`` (DistiLLM)."""
    if skew == 0.0:
        return forward_kl(student_logp, teacher_logp)
    return _kl(teacher_logp, _log_mixture(teacher_logp, student_logp, skew))


def tvd(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """Total variation distance ½ Σ |p_t − p_s| per token."""
    return 0.5 * (teacher_logp.exp() - student_logp.exp()).abs().sum(-1)


def forward_kl_fused(
    student: Tensor, teacher: Tensor, student_lse: Tensor, teacher_lse: Tensor
) -> tuple[Tensor, Tensor]:
    """Forward KL per token and its gradient w.r.t. ``student`` logits, from logits and their
    log-sum-exps (``[..., 1]``): KL = Σ p_t (log p_t − log p_s), gradient p_s − p_t. The
    log-probabilities first: Σ p_t (t − s) − lse_t + lse_s, the same in exact arithmetic,
    subtracts numbers of the logits' size, and in fp32 lost the value (a KL of −47,786 for
    6.45 with logits shifted by 1e6, 37 % off with a shift of 300)."""
    teacher_logp = teacher - teacher_lse
    student_logp = student - student_lse
    teacher_p = teacher_logp.exp()
    value = torch.linalg.vecdot(teacher_logp.sub_(student_logp), teacher_p)
    return value, student_logp.exp_().sub_(teacher_p)


def reverse_kl_fused(
    student: Tensor, teacher: Tensor, student_lse: Tensor, teacher_lse: Tensor
) -> tuple[Tensor, Tensor]:
    """Reverse KL per token and its gradient w.r.t. ``student`` logits:
    KL = Σ p_s r with r = log p_s − log p_t, gradient p_s (r − KL)."""
    student_logp = student - student_lse
    log_ratio = student_logp - (teacher - teacher_lse)  # log-probabilities first (forward_kl_fused)
    student_p = student_logp.exp_()
    value = torch.linalg.vecdot(student_p, log_ratio)
    return value, log_ratio.sub_(value.unsqueeze(-1)).mul_(student_p)


DIVERGENCES: dict[str, Callable[..., Tensor]] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": jsd,
    "skew_kl": skew_kl,
    "tvd": tvd,
}

FusedDivergence = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]
"""``(student_logits, teacher_logits, student_lse, teacher_lse) -> (per-token value, gradient
w.r.t. student_logits)``, logits already divided by the temperature."""

FUSED: dict[str, FusedDivergence] = {"forward_kl": forward_kl_fused, "reverse_kl": reverse_kl_fused}
"""Closed-form value-and-gradient versions the chunked loss uses instead of autograd: a few passes
over each vocab-sized chunk instead of dozens. Divergences without one fall back to autograd;
tests check both routes against the full-logit computation."""


@dataclass(frozen=True)
class Divergence:
    """A per-token divergence (callable as ``(student_logp, teacher_logp) -> [...]``)."""

    name: str
    fn: Callable[[Tensor, Tensor], Tensor]
    fused: FusedDivergence | None = None
    """Value and gradient from logits in one go, when a closed form is known."""

    def __call__(self, student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
        return self.fn(student_logp, teacher_logp)


def get_divergence(name: str, *, beta: float = 0.5, skew: float = 0.1) -> Divergence:
    """The per-token divergence registered as ``name``, with its mixing parameter bound.

    Raises ``ValueError`` naming the allowed values for an unknown name or an out-of-range
    ``beta``/``skew``.
    """
    if name not in DIVERGENCES:
        raise ValueError(
            f"unknown divergence {name!r}; choose one of {sorted(DIVERGENCES)} "
            f"(e.g. distill.divergence=forward_kl)"
        )
    if name == "jsd":
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"distill.beta={beta} is outside [0, 1]; 0.5 is the symmetric JSD")
        return Divergence(name, partial(jsd, beta=beta))
    if name == "skew_kl":
        if not 0.0 <= skew < 1.0:
            raise ValueError(f"distill.skew={skew} is outside [0, 1); DistiLLM uses 0.1")
        return Divergence(name, partial(skew_kl, skew=skew))
    return Divergence(name, DIVERGENCES[name], FUSED.get(name))
