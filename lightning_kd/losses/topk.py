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

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_kd.losses.divergences import TokenDivergence
from lightning_kd.losses.logits import math_dtype


@dataclass(frozen=True)
class TopKTeacher:
    """A cached teacher's records of scored tokens, aligned with them: ``ids`` / ``log_probs``
    ``[tokens, k]``, ``tail`` ``[tokens]``, over a vocabulary of ``vocab`` entries (a student
    with padding rows beyond it is compared over these)."""

    ids: Tensor
    log_probs: Tensor
    tail: Tensor
    vocab: int

    def select(self, mask: Tensor) -> TopKTeacher:
        """The records where ``mask`` (``[batch, positions]``) holds, flattened to ``[tokens]``."""
        return TopKTeacher(self.ids[mask], self.log_probs[mask], self.tail[mask], self.vocab)

    def __getitem__(self, rows: slice) -> TopKTeacher:
        """The records of tokens ``rows`` (a chunk)."""
        return TopKTeacher(self.ids[rows], self.log_probs[rows], self.tail[rows], self.vocab)

    def divergence(self, student_logits: Tensor, divergence: TokenDivergence) -> Tensor:
        """Per-token ``divergence`` of the student's bucketed distribution from these records."""
        student_logits = student_logits[..., : self.vocab]
        return top_k_divergence(student_logits, self.ids, self.log_probs, self.tail, divergence)


def teacher_top_k(teacher_logits: Tensor, k: int, temperature: float = 1.0) -> tuple[Tensor, ...]:
    """``(ids, log_probs, tail_log_mass)`` of ``softmax(teacher_logits / T)``: the k most probable
    tokens ``[..., k]`` (most probable first) and ``log(1 − Σ top-k p)`` ``[...]`` (−inf when the
    top k hold everything)."""
    if not 1 <= k <= teacher_logits.shape[-1]:
        raise ValueError(f"cache.k={k}; choose 1..{teacher_logits.shape[-1]} (the vocabulary)")
    log_probs = torch.log_softmax(
        teacher_logits.to(math_dtype(teacher_logits.dtype)) / temperature, -1
    )
    top, ids = log_probs.topk(k, dim=-1)
    return ids, top, tail_log_mass(log_probs, ids)


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
