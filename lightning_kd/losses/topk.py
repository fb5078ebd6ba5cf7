"""Divergences from a teacher kept as its top-k tokens plus the mass of the rest (a cached teacher).

A teacher distribution ``p`` over the vocabulary is stored per scored token as the ids ``S`` of its
k most probable tokens, their log-probabilities ``log p_i`` (i ∈ S), and the log of the mass left
over, ``log r = log(1 − Σ_S p_i)``. That record determines the *bucketed* distribution
``P = (p_S, r)`` over k + 1 outcomes — the k tokens and "any other token" — and nothing finer. The
student's distribution ``q`` is bucketed the same way, ``Q = (q_S, q_tail)``, from its full logits
(its normaliser needs them anyway), and every divergence of :mod:`~lightning_kd.losses.divergences`
is computed between ``Q`` and ``P``: they take log-probabilities over any last dimension.

- With k = vocabulary size the tail is empty and the bucketed divergence *is* the divergence.
- With k < vocabulary size it is the divergence between the coarsened distributions: for forward
  KL a lower bound of the full one that ignores how the tail's mass is spread (data processing),
  and whose gradient still pulls the student's tail mass to the teacher's.
- Temperature: ``p^(1/T)`` renormalised needs the tail's logits, which are not stored, so a cache
  holds the teacher at one temperature (written with it) and serves only runs at that temperature.

Pure tensor functions: ``losses/`` imports neither the module nor Lightning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.divergences import TokenDivergence, get_divergence
from lightning_kd.losses.logits import EvalSums, math_dtype
from lightning_kd.utils.refusal import Refused


@dataclass(frozen=True)
class TopKTeacher:
    """A cached teacher's records of scored tokens, aligned with them: ``ids`` / ``log_probs``
    ``[tokens, k]``, ``tail`` ``[tokens]``, over a vocabulary of ``vocab`` entries (a student
    with padding rows beyond it is compared over these)."""

    ids: Tensor
    log_probs: Tensor
    tail: Tensor
    vocab: int
    target: Tensor | None = None
    """The teacher's log-probability (T = 1) of the token that followed, where recorded."""

    def select(self, mask: Tensor) -> TopKTeacher:
        """The records where ``mask`` (``[batch, positions]``) holds, flattened to ``[tokens]``."""
        return self._map(lambda tensor: tensor[mask])

    def __getitem__(self, rows: slice | tuple[slice, ...]) -> TopKTeacher:
        """The records of tokens ``rows`` (a chunk; or rows and positions of unflattened
        records)."""
        return self._map(lambda tensor: tensor[rows])

    def _map(self, take) -> TopKTeacher:
        target = None if self.target is None else take(self.target)
        return TopKTeacher(
            take(self.ids), take(self.log_probs), take(self.tail), self.vocab, target
        )

    @property
    def covers_vocab(self) -> bool:
        """Whether the records hold every token (k = vocabulary): no tail bucket at all."""
        return self.ids.shape[-1] == self.vocab

    def check_width(self, width: int) -> TopKTeacher:
        """These records, once every id is a row of a student head ``width`` rows wide. Only a
        teacher head padded past the student's (Qwen's 151,936 rows for 151,665 tokens) can
        hold others, and only if a padding row was among its most probable: an index error
        in the loss, where online KD compares the rows the two share."""
        if self.vocab > width and (largest := int(self.ids.max())) >= width:
            raise Refused(
                f"the teacher cache holds token id {largest} among the teacher's top "
                f"{self.ids.shape[-1]}, beyond the student's {width} output rows: the teacher's "
                f"head has {self.vocab} rows (padding past the tokenizer). Train without the "
                "cache (distill.teacher_cache=null), which compares the rows the two share, or "
                f"give the student the teacher's {self.vocab} rows"
            )
        return self

    def divergence(self, student_logits: Tensor, divergence: TokenDivergence) -> Tensor:
        """Per-token ``divergence`` of the student's bucketed distribution from these records."""
        self.check_width(student_logits.shape[-1])
        student_logits = student_logits[..., : self.vocab]
        return top_k_divergence(student_logits, self.ids, self.log_probs, self.tail, divergence)


def teacher_top_k(teacher_logits: Tensor, k: int, temperature: float = 1.0) -> tuple[Tensor, ...]:
    """``(ids, log_probs, tail_log_mass)`` of ``softmax(teacher_logits / T)``: the k most probable
    tokens ``[..., k]`` (most probable first) and ``log(1 − Σ top-k p)`` ``[...]`` (−inf when the
    top k hold everything)."""
    return top_k_and_tail(scaled_log_probs(teacher_logits, k, temperature), k)


def teacher_records(
    teacher_logits: Tensor, targets: Tensor, k: int, temperature: float = 1.0
) -> tuple[Tensor, ...]:
    """``(ids, log_probs, tail_log_mass, target_log_prob)``: :func:`teacher_top_k` and
    :func:`target_log_prob` of one chunk, the cache writer's hot loop; at T = 1 one log-softmax
    serves both (no second logsumexp over the vocabulary)."""
    log_probs = scaled_log_probs(teacher_logits, k, temperature)
    if temperature == 1:
        target = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # before the masking
    else:
        target = target_log_prob(teacher_logits, targets)
    return (*top_k_and_tail(log_probs, k), target)


def scaled_log_probs(teacher_logits: Tensor, k: int, temperature: float) -> Tensor:
    """``log_softmax(teacher_logits / T)`` in the math dtype (no ``/ 1`` copy), k checked."""
    if not 1 <= k <= teacher_logits.shape[-1]:
        raise ValueError(f"cache.k={k}; choose 1..{teacher_logits.shape[-1]} (the vocabulary)")
    logits = teacher_logits.to(math_dtype(teacher_logits.dtype))
    return torch.log_softmax(logits if temperature == 1 else logits / temperature, -1)


def top_k_and_tail(log_probs: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(ids, top log-probs, tail log-mass)`` of ``log_probs``, which it overwrites: the tail is
    summed over the log-probs with the top k masked in place (``tail_log_mass`` without a copy)."""
    top, ids = log_probs.topk(k, dim=-1)
    return ids, top, torch.logsumexp(log_probs.scatter_(-1, ids, float("-inf")), dim=-1)


def target_log_prob(teacher_logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(teacher_logits)[target]`` at T = 1 ``[...]``: the teacher's NLL of the token
    that followed (its perplexity), whether or not that token is among the top k."""
    logits = teacher_logits.to(math_dtype(teacher_logits.dtype))
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)


def tail_log_mass(log_probs: Tensor, ids: Tensor) -> Tensor:
    """``log Σ_{v ∉ ids} p_v`` from full log-probabilities, summed over the tail itself (not
    ``log(1 − Σ p_ids)``, which loses every digit when the top k hold nearly all the mass)."""
    outside = log_probs.scatter(-1, ids, float("-inf"))
    return torch.logsumexp(outside, dim=-1)


def bucketed(log_probs: Tensor, ids: Tensor) -> Tensor:
    """``[..., k + 1]``: the log-probabilities of ``ids`` and, last, of every other token."""
    return torch.cat([log_probs.gather(-1, ids), tail_log_mass(log_probs, ids).unsqueeze(-1)], -1)


def top_k_divergence(
    student_logits: Tensor,
    ids: Tensor,
    teacher_log_probs: Tensor,
    teacher_tail: Tensor,
    divergence: TokenDivergence,
) -> Tensor:
    """Per-token divergence between the student's and a cached teacher's bucketed distributions.

    ``student_logits`` ``[..., vocab]`` (at the cache's temperature); ``ids`` and
    ``teacher_log_probs`` ``[..., k]`` and ``teacher_tail`` ``[...]`` as :func:`teacher_top_k`
    returns them. Where the
    tail is empty for the teacher (k = vocabulary) it is dropped for both, so the value and its
    gradient are the full divergence's exactly.
    """
    dtype = math_dtype(student_logits.dtype)
    student_log_probs = torch.log_softmax(student_logits.to(dtype), -1)
    teacher = teacher_log_probs.to(dtype)
    if ids.shape[-1] == student_logits.shape[-1]:
        # Nothing outside the top k: no tail bucket (an empty log-sum-exp's gradient is NaN).
        return divergence(student_log_probs.gather(-1, ids), teacher)
    student = bucketed(student_log_probs, ids)
    teacher = torch.cat([teacher, teacher_tail.to(dtype).unsqueeze(-1)], -1)
    return divergence(student, teacher)


def top_k_evaluation_sums(
    chunks: Iterable[tuple[Tensor, TopKTeacher, Tensor]],
    divergence: TokenDivergence,
    temperature: float = 1.0,
) -> EvalSums:
    """:func:`~lightning_kd.losses.logits.evaluation_sums` against a cached teacher's records.

    Exact: the student's NLL, the teacher's (from the recorded log-probability of each next
    token) and top-1 agreement (the record's first id is the teacher's argmax). Bucketed (equal
    to the full value at k = vocabulary, a lower bound for forward KL below it): the trained
    divergence, and ``forward_kl`` — which is at T = 1 only when the cache's temperature is 1
    (else it is reported as NaN: the records hold the teacher at T alone).
    """
    forward = get_divergence("forward_kl")
    totals = None
    for student_logits, teacher, targets in chunks:
        if teacher.target is None:
            raise ValueError("the cached records hold no next-token log-probabilities")
        student_logits = student_logits.to(math_dtype(student_logits.dtype))
        student_logp = F.log_softmax(student_logits, dim=-1)
        shared = student_logits[..., : teacher.check_width(student_logits.shape[-1]).vocab]
        kd = teacher.divergence(shared / temperature, divergence).sum() * temperature**2
        forward_kl = (
            teacher.divergence(shared, forward).sum()
            if temperature == 1.0
            else torch.full_like(kd, float("nan"))
        )
        values = [
            -student_logp.gather(-1, targets.unsqueeze(-1)).sum(),
            -teacher.target.to(student_logp.dtype).sum(),
            forward_kl,
            kd,
            (shared.argmax(-1) == teacher.ids[:, 0]).sum(),
            torch.tensor(targets.numel(), device=targets.device),
        ]
        totals = values if totals is None else [a + b for a, b in zip(totals, values, strict=True)]
    if totals is None:
        raise ValueError("top_k_evaluation_sums got no chunks")
    return EvalSums(*totals)
