"""Logit distillation on full ``[batch, seq, vocab]`` logits: causal shift, masking, reduction.

``labels`` are aligned with the inputs, as in Hugging Face models: position ``t``'s logits are
scored against ``labels[t + 1]``, and a label of ``-100`` (padding, prompt tokens) masks that
prediction out of both the distillation term and the cross-entropy term.

Temperature: the divergence compares ``softmax(logits / T)`` of both models and is multiplied by
``T²`` (Hinton et al., 2015), which keeps its gradient on the same scale as the cross-entropy's when
T changes. The cross-entropy term always uses T = 1: it is the student's own language-model loss.

Vocabularies that differ only by padding (Qwen checkpoints pad 151936 to 152064) are compared over
the shared leading range; checking that the two tokenizers really agree is the caller's job (see
``lightning_kd.models.student.check_vocabularies``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.divergences import TokenDivergence, get_divergence

IGNORE_INDEX = -100


@dataclass(frozen=True)
class LogitObjective:
    """What the logit terms are and how they combine: ``kd_weight · Σ T²·divergence +
    ce_weight · Σ CE``. The one place that combination is written."""

    divergence: TokenDivergence
    temperature: float = 1.0
    """Softmax temperature of the divergence (CE always uses T = 1)."""
    kd_weight: float = 1.0
    ce_weight: float = 0.0

    def combine(self, kd: Tensor, ce: Tensor) -> Tensor:
        """The weighted objective from the divergence and cross-entropy terms (sums or means)."""
        return self.kd_weight * kd + self.ce_weight * ce


@dataclass
class LossSums:
    """Token sums of the two logit terms and the number of tokens they were summed over.

    Sums (not means) so that micro-batches of different token counts combine exactly: the mean
    over any set of batches is ``sum(kd) / sum(tokens)``.
    """

    kd: Tensor
    """Σ over unmasked tokens of T² · divergence (fp32 scalar)."""
    ce: Tensor
    """Σ over unmasked tokens of the student's cross-entropy at T = 1 (fp32 scalar)."""
    tokens: Tensor
    """Number of unmasked (scored) tokens (int64 scalar)."""
    features: Tensor | None = None
    """Σ over the same tokens of the weighted feature-matching terms, when any are configured."""
    teachers: dict[str, Tensor] | None = None
    """With several teachers: each one's own (unweighted) divergence sum, by name; ``kd`` is
    then their weighted sum."""
    teacher_tokens: dict[str, Tensor] | None = None
    """With several teachers: the tokens each one's sum is over (the rows it teaches), by name,
    for its own mean (``train/kd/<name>``)."""
    span: Tensor | None = None
    """With a span-level term (``distill.cross_span_weight``): its weighted sum, a part of
    ``kd`` reported on its own (``train/span``)."""
    ce_trained: bool = True
    """Whether ``ce`` entered the objective (not on the student's own sampled completions, whose
    CE is reported but not trained: ``distill/on_policy.py``)."""


def weighted_sum(terms: list[tuple[float, Tensor | None]]) -> Tensor | None:
    """Σ weight · value over the ``(weight, value)`` pairs with a value (None: none has one):
    a part of ``kd`` that only some terms have, as ``kd`` weighs them."""
    given = [weight * value for weight, value in terms if value is not None]
    return sum(given[1:], given[0]) if given else None


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmax and divergence math runs in: fp64 stays fp64, anything else is fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def next_token_targets(labels: Tensor) -> tuple[Tensor, Tensor]:
    """``(targets, scored)`` of positions ``0 .. seq−2``: position t is scored against
    ``labels[t + 1]`` unless that label is −100. The one place the causal shift is written."""
    targets = labels[..., 1:]
    return targets, targets != IGNORE_INDEX


def scored_mask(labels: Tensor) -> Tensor:
    """``[batch, seq]``: the positions that predict a label (the last one never does)."""
    return F.pad(next_token_targets(labels)[1], (0, 1), value=False)


def scored_next_token(values: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``values`` (``[batch, seq, ...]``: logits or hidden states) at the positions that predict a
    label, flattened to ``[tokens, ...]``, and those labels ``[tokens]``."""
    targets, mask = next_token_targets(labels)
    return scored(values[..., :-1, :], mask), scored(targets, mask)


def shared_vocab(student_logits: Tensor, teacher_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Both logits over the vocabulary range they share (padding rows of either dropped)."""
    vocab = min(student_logits.shape[-1], teacher_logits.shape[-1])
    return student_logits[..., :vocab], teacher_logits[..., :vocab]


def token_divergence(
    student_logits: Tensor,
    teacher_logits: Tensor,
    divergence: TokenDivergence,
    temperature: float = 1.0,
) -> Tensor:
    """Per-token ``T² · divergence(softmax(s / T), softmax(t / T))`` over the shared vocab."""
    dtype = math_dtype(student_logits.dtype)
    student_logits, teacher_logits = shared_vocab(student_logits, teacher_logits)
    student_logp = F.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    return divergence(student_logp, teacher_logp) * temperature**2


def token_cross_entropy(student_logits: Tensor, targets: Tensor) -> Tensor:
    """Per-token cross-entropy in fp32; masked targets (−100) give 0."""
    flat = F.cross_entropy(
        student_logits.to(math_dtype(student_logits.dtype)).flatten(0, -2),
        targets.flatten(),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(targets.shape)


def logit_distillation_sums(
    student_logits: Tensor,
    teacher_logits: Tensor | None,
    labels: Tensor,
    divergence: TokenDivergence,
    temperature: float = 1.0,
) -> LossSums:
    """Token sums of the distillation and cross-entropy terms for one batch of full logits.

    ``teacher_logits=None`` (a CE-only run that skips the teacher) gives a zero divergence term.
    """
    # The vocab-sized fp32 work runs on the scored positions alone.
    student_logits, targets = scored_next_token(student_logits, labels)
    tokens = torch.tensor(targets.numel(), device=targets.device)
    ce = token_cross_entropy(student_logits, targets).sum()
    if teacher_logits is None:
        return LossSums(kd=torch.zeros_like(ce), ce=ce, tokens=tokens)
    teacher_logits = scored_next_token(teacher_logits, labels)[0]
    kd = token_divergence(student_logits, teacher_logits, divergence, temperature)
    return LossSums(kd=kd.sum(), ce=ce, tokens=tokens)


def scored(values: Tensor, mask: Tensor) -> Tensor:
    """``values[mask]`` (positions first), without a copy when every position is scored."""
    if bool(mask.all()):
        return values.flatten(0, mask.ndim - 1)
    return values[mask]


@dataclass
class EvalSums:
    """Token sums of the validation metrics (all fp32/fp64 scalars except ``tokens``)."""

    student_nll: Tensor
    teacher_nll: Tensor
    forward_kl: Tensor
    """Σ KL(teacher ‖ student) at T = 1, whatever divergence is trained."""
    kd: Tensor
    """Σ of the trained divergence term (T²-scaled), to report the training objective."""
    agreement: Tensor
    """Number of tokens where the two models' top-1 predictions agree."""
    tokens: Tensor


def evaluation_sums(
    chunks: Iterable[tuple[Tensor, Tensor, Tensor]],
    divergence: TokenDivergence,
    temperature: float = 1.0,
) -> EvalSums:
    """Validation sums over ``(student_logits, teacher_logits, targets)`` chunks of scored tokens.

    Full-logit callers pass one chunk; the chunked path passes logits a chunk at a time. Each
    model's log-softmax is computed once per chunk and shared by its NLL and the KL (and by the
    trained divergence when that is forward KL at T = 1): validation's vocab-sized passes are as
    expensive per token as a training step's.
    """
    forward = get_divergence("forward_kl")
    totals = None
    for student_logits, teacher_logits, targets in chunks:
        dtype = math_dtype(student_logits.dtype)
        student_logp = F.log_softmax(student_logits.to(dtype), dim=-1)
        teacher_logp = F.log_softmax(teacher_logits.to(dtype), dim=-1)
        shared = [  # over the shared vocabulary (renormalised where a model has padding rows)
            logp if logp.shape[-1] == trimmed.shape[-1] else F.log_softmax(trimmed.to(dtype), -1)
            for logp, trimmed in zip(
                (student_logp, teacher_logp),
                shared_vocab(student_logits, teacher_logits),
                strict=True,
            )
        ]
        forward_kl = forward(*shared).sum()
        if divergence == forward and temperature == 1.0:
            kd = forward_kl
        else:
            kd = token_divergence(student_logits, teacher_logits, divergence, temperature).sum()
        agree = shared[0].argmax(-1) == shared[1].argmax(-1)
        values = [
            -student_logp.gather(-1, targets.unsqueeze(-1)).sum(),
            -teacher_logp.gather(-1, targets.unsqueeze(-1)).sum(),
            forward_kl,
            kd,
            agree.sum(),
            torch.tensor(targets.numel(), device=targets.device),
        ]
        totals = values if totals is None else [a + b for a, b in zip(totals, values, strict=True)]
    if totals is None:
        raise ValueError("evaluation_sums got no chunks")
    return EvalSums(*totals)


def logit_distillation_loss(
    student_logits: Tensor,
    teacher_logits: Tensor,
    labels: Tensor,
    divergence: str = "forward_kl",
    temperature: float = 1.0,
    kd_weight: float = 1.0,
    ce_weight: float = 0.0,
    beta: float = 0.5,
    skew: float = 0.1,
) -> Tensor:
    """``kd_weight · KD + ce_weight · CE``, each a mean over the unmasked tokens of the batch.

    A convenience for plain PyTorch loops and for checking against other implementations; the
    Lightning module works with :func:`logit_distillation_sums` so accumulation stays exact.
    """
    objective = LogitObjective(
        get_divergence(divergence, beta=beta, skew=skew), temperature, kd_weight, ce_weight
    )
    sums = logit_distillation_sums(
        student_logits, teacher_logits, labels, objective.divergence, temperature
    )
    return objective.combine(sums.kd, sums.ce) / sums.tokens.clamp(min=1)
