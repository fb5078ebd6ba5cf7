"""Logit distillation across vocabularies: a teacher whose tokenizer is not the student's.

At a student position aligned with a teacher position (``data/alignment.py``: both have read the
same text and predict what follows it), the teacher's distribution over *its* vocabulary is kept as
its top k tokens (``cross_top.py``, a chunk of positions at a time: no ``[positions,
teacher_vocab]`` tensor outlives its chunk), then read through a map of the two vocabularies
(:func:`cross_records`). Three losses compare it with the student's distribution over the
student's vocabulary:

- ``uld`` (Universal Logit Distillation, Boizard et al. 2024): the Wasserstein-1 distance between
  the two distributions with every token at unit distance from every other, which is the L1
  distance between the *sorted* probability vectors — no token correspondence needed, so no
  vocabulary agreement used either. Here over each side's top k (the rest, zeros).
- ``hybrid`` (in the spirit of TRL's GOLD): the teacher tokens that spell the same bytes as a
  student token (``data/vocab_maps.vocabulary_map``: " the" in both, the document end in both) are
  compared by the run's divergence, on the distributions bucketed into those tokens plus "any
  other token" (as a top-k cache is, ``losses/topk.py``); the teacher's top-k tokens with no
  student twin are compared with the student's tokens that have no teacher twin by ULD, weighted
  ``uld_weight``. With identical tokenizers and k = vocabulary every token matches, the ULD part
  is 0 and the bucketed divergence *is* the same-tokenizer divergence.
- ``projected``: every teacher token is credited to the student token the student's tokenizer
  starts its text with (``data/vocab_maps.first_token_map``: Gemma's "▁understanding" to SmolLM2's
  " under" where that is how SmolLM2 spells it), the teacher's top-k mass summed per student
  token — its next-token distribution projected onto the student's vocabulary — and the run's
  divergence compares the two over the projection's top k plus "any other token". No mass is
  lost to tokens without an exact twin.

With ``distill.cross_span_weight`` a span-level term joins any of the three (``cross_spans.py``):
the two models' probabilities of the text between consecutive aligned positions.

Positions with no partner add nothing to the divergence (their CE stays). Everything here is a pure
function of tensors; :class:`CrossTeacher` plays the part a cached teacher's
:class:`~lightning_kd.losses.topk.TopKTeacher` plays in the chunked loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.cross_spans import span_divergence
from lightning_kd.losses.cross_top import TeacherTop, spread
from lightning_kd.losses.divergences import TokenDivergence, get_divergence
from lightning_kd.losses.logits import math_dtype

LOSSES = ("hybrid", "uld", "projected")

FLOOR = -1.0e4
"""A log-probability whose probability is exactly 0 in fp32 and fp64, used instead of −inf for
buckets that hold nothing: a mixture divergence's ``logaddexp(−inf, −inf)`` has a NaN gradient,
this has none."""


@dataclass(frozen=True)
class CrossTeacher:
    """The teacher's records at student positions ``[..., k]`` (and ``[...]``), and what the
    loss needs to compare them with the student's logits."""

    ids: Tensor
    """The student ids of the teacher's top-k tokens (0 where a token has no student twin)."""
    log_probs: Tensor
    """Their log-probabilities at the temperature (:data:`FLOOR` where no twin)."""
    matched: Tensor
    """Which of the top k have a student twin (bool)."""
    tail: Tensor
    """Log of the teacher's mass outside its matched tokens (at least :data:`FLOOR`)."""
    top_probs: Tensor
    """The teacher's top-k probabilities, most probable first, matched or not."""
    aligned: Tensor
    """Whether the position has a teacher partner at all (bool; else its records are filler)."""
    student_twins: Tensor
    """``[student_vocab]``: student ids that some teacher token spells (bool)."""
    loss: str = "hybrid"
    uld_weight: float = 1.0
    span: Tensor | None = None
    """Each position's span (``cross_spans.span_grid``: its id, −1 outside); None: no span term."""
    span_log_prob: Tensor | None = None
    """The teacher's log-probability of the span a position is in (0 outside)."""
    span_weight: float = 0.0

    def _map(self, take) -> CrossTeacher:
        fields = ("ids", "log_probs", "matched", "tail", "top_probs", "aligned")
        spans = {}
        if self.span is not None:
            spans = {"span": take(self.span), "span_log_prob": take(self.span_log_prob)}
        return CrossTeacher(
            **{name: take(getattr(self, name)) for name in fields},
            **spans,
            student_twins=self.student_twins,
            loss=self.loss,
            uld_weight=self.uld_weight,
            span_weight=self.span_weight,
        )

    def spread(self, wanted: Tensor) -> CrossTeacher:
        """These records (of the ``wanted`` positions, in order) spread over ``wanted``'s grid
        ``[batch, seq − 1]``, filler where nothing is wanted."""
        fillers = {"ids": 0, "log_probs": FLOOR, "matched": False, "tail": FLOOR}
        fillers |= {"top_probs": 0.0, "aligned": False}
        return dataclasses.replace(
            self,
            **{name: spread(getattr(self, name), wanted, fill) for name, fill in fillers.items()},
        )

    def with_spans(self, span: Tensor, span_log_prob: Tensor, weight: float) -> CrossTeacher:
        """The same records with a span-level term of ``weight`` (``cross_spans.span_grid``)."""
        return dataclasses.replace(self, span=span, span_log_prob=span_log_prob, span_weight=weight)

    @property
    def has_span_term(self) -> bool:  # a span-level term, with a weight
        return self.span is not None and bool(self.span_weight)

    def span_divergence(self, student_log_probs: Tensor) -> Tensor:
        """The weighted span term (spans whole) from the student's next-token log-probs, T = 1."""
        if not self.has_span_term:
            return student_log_probs.sum() * 0.0
        return self.span_weight * span_divergence(student_log_probs, self.span, self.span_log_prob)

    def select(self, mask: Tensor) -> CrossTeacher:
        """The records where ``mask`` (``[batch, positions]``) holds, flattened to ``[tokens]``."""
        return self._map(lambda tensor: tensor[mask])

    def __getitem__(self, rows) -> CrossTeacher:
        return self._map(lambda tensor: tensor[rows])

    def divergence(self, student_logits: Tensor, divergence: TokenDivergence) -> Tensor:
        """Per-position loss of the student's logits (at the temperature) against these records:
        0 where a position has no partner."""
        dtype = math_dtype(student_logits.dtype)
        log_q = torch.log_softmax(student_logits.to(dtype), -1)
        if self.loss == "uld":
            value = sorted_l1(log_q.exp(), self.top_probs.to(dtype))
        elif self.loss == "projected":
            value = self._matched(log_q, divergence)
        else:
            value = self._matched(log_q, divergence) + self.uld_weight * self._unmatched(log_q)
        return torch.where(self.aligned, value, 0.0)

    def _matched(self, log_q: Tensor, divergence: TokenDivergence) -> Tensor:
        """The divergence between the distributions bucketed into the matched tokens + the rest."""
        ids = self.ids
        in_matched = torch.zeros_like(log_q, dtype=torch.long).scatter_add_(
            1, ids, self.matched.long()
        )
        student_top = log_q.gather(1, ids).masked_fill(~self.matched, FLOOR)
        student_tail = torch.logsumexp(log_q.masked_fill(in_matched > 0, FLOOR), -1)
        student = torch.cat([student_top, student_tail.unsqueeze(-1)], -1)
        teacher = torch.cat([self.log_probs, self.tail.unsqueeze(-1)], -1).to(log_q.dtype)
        # "Any other token" empty on one side alone (k covers the student's whole vocabulary, or
        # the teacher's): a forward or reverse KL infinite for the bucketing, not the models;
        # FLOOR made it ~1e4 x that mass, as value (and for reverse KL, gradient). Compared there
        # on the matched tokens alone, each side renormalised (hybrid's ULD takes the rest).
        empty = torch.stack([student_tail, self.tail.to(log_q.dtype)]) < FLOOR / 2
        one_sided = (empty[0] != empty[1]).unsqueeze(-1)
        student = torch.where(one_sided, on_matched(student), student)
        teacher = torch.where(one_sided, on_matched(teacher), teacher)
        return divergence(student, teacher)

    def _unmatched(self, log_q: Tensor) -> Tensor:
        """ULD between the teacher's top-k tokens with no student twin and the student's tokens
        with no teacher twin."""
        teacher = self.top_probs.to(log_q.dtype).masked_fill(self.matched, 0.0)
        student = log_q.exp().masked_fill(self.student_twins[: log_q.shape[-1]], 0.0)
        return sorted_l1(student, teacher)


def on_matched(log_probs: Tensor) -> Tensor:
    """Bucketed log-probabilities (``[..., k + 1]``, the last "any other token") conditioned on
    the matched tokens: the last emptied, the rest renormalised."""
    top = log_probs[..., :-1]
    top = top - torch.logsumexp(top, -1, keepdim=True)
    return torch.cat([top, torch.full_like(log_probs[..., -1:], FLOOR)], -1)


def sorted_l1(student_probs: Tensor, teacher_top: Tensor) -> Tensor:
    """``Σ_i |sort(q)_i − sort(p)_i|`` over the k largest of each (k = ``teacher_top``'s width):
    ULD's Wasserstein-1 distance at unit transport cost, truncated to the top k. A student of
    fewer than k tokens is padded with zeros, as Boizard et al. pad the smaller vocabulary (it
    was cut to the student's width, dropping the teacher's entries past it). A student of more
    than k tokens is cut to its top k like the teacher: this is the paper's ULD less the
    student's mass past its top k, which gets no gradient here."""
    k = teacher_top.shape[-1]
    student_top = student_probs.topk(min(k, student_probs.shape[-1]), dim=-1).values
    student_top = F.pad(student_top, (0, k - student_top.shape[-1]))
    teacher_sorted = teacher_top.sort(dim=-1, descending=True).values
    return (student_top - teacher_sorted).abs().sum(-1)


def twins(mapping: Tensor, student_vocab: int) -> Tensor:
    """``[student_vocab]``: the student ids some teacher id maps to (``vocabulary_map``)."""
    present = torch.zeros(student_vocab, dtype=torch.bool, device=mapping.device)
    hits = mapping[mapping >= 0]
    present[hits[hits < student_vocab]] = True
    return present


def at_column(top: TeacherTop, rows: Tensor, token: int, column: int) -> TeacherTop:
    """``top`` (``[n, k]``) with the teacher id ``token`` read as ``column`` in the ``rows``
    (``[n]``, bool): the map's extra entry, where one teacher token means another student
    token there (``data/vocab_maps.end_column``)."""
    ids = torch.where(rows.unsqueeze(-1) & (top.ids == token), column, top.ids)
    return TeacherTop(ids, top.log_probs, top.rest)


def cross_records(
    top: TeacherTop,
    mapping: Tensor,
    student_twins: Tensor,
    *,
    loss: str = "hybrid",
    uld_weight: float = 1.0,
) -> CrossTeacher:
    """The records of the teacher's ``top`` (``[n, k]``) for the student: its tokens through
    ``mapping`` (``vocabulary_map``'s one-to-one twins, or ``first_token_map``'s many-to-one
    projection for ``projected``)."""
    if loss not in LOSSES:
        raise ValueError(f"distill.cross_loss={loss!r}; choose one of {list(LOSSES)}")
    if loss == "projected":
        columns = _projected(top, mapping, student_twins.numel())
    else:
        columns = _records(top, mapping)
    ids, log_probs, matched, tail, top_probs = columns
    aligned = torch.ones(len(ids), dtype=torch.bool, device=ids.device)
    return CrossTeacher(
        ids, log_probs, matched, tail, top_probs, aligned, student_twins, loss, uld_weight
    )


def _mapped(top: TeacherTop, mapping: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The top-k tokens' ids through ``mapping`` (−1: none), which have one, and the log of the
    mass outside those mapped tokens — the rest plus the unmapped top-k entries, summed over
    themselves, not 1 − Σ mapped (which cancels to nothing when they hold nearly everything)."""
    student_ids = mapping.to(top.ids.device)[top.ids]
    mapped = student_ids >= 0
    unmapped = torch.logsumexp(top.log_probs.masked_fill(mapped, float("-inf")), -1)
    return student_ids, mapped, torch.logaddexp(top.rest, unmapped)


def _records(top: TeacherTop, mapping: Tensor) -> tuple[Tensor, ...]:
    """``(ids, log_probs, matched, tail, top_probs)`` of one-to-one twins."""
    student_ids, matched, outside = _mapped(top, mapping)
    return (
        student_ids.clamp(min=0),
        top.log_probs.masked_fill(~matched, FLOOR),
        matched,
        outside.clamp(min=FLOOR),
        top.log_probs.exp(),
    )


def _projected(top: TeacherTop, mapping: Tensor, student_vocab: int) -> tuple[Tensor, ...]:
    """The records of the teacher's top-k mass summed per student token (``mapping`` many to
    one), the projection's own top k kept."""
    student_ids, mapped, outside = _mapped(top, mapping)
    mass = top.log_probs.exp() * mapped
    k = top.ids.shape[-1]
    dense = mass.new_zeros(len(mass), student_vocab).scatter_add_(1, student_ids.clamp(min=0), mass)
    projected, ids = dense.topk(min(k, student_vocab), dim=-1)
    matched = projected > 0
    # The tail: the teacher's mass outside its mapped top k, and what of that top k fell outside
    # the projection's top k.
    dropped = (mass.sum(-1) - projected.sum(-1)).clamp(min=0)
    tail = torch.logaddexp(outside, dropped.log()).clamp(min=FLOOR)
    log_probs = projected.clamp(min=1e-38).log().masked_fill(~matched, FLOOR)
    return ids, log_probs, matched, tail, top.log_probs.exp()


def cross_evaluation_sums(
    chunks, divergence: TokenDivergence, temperature: float = 1.0
) -> dict[str, Tensor]:
    """Validation sums of ``(student_logits, CrossTeacher, targets)`` chunks: the student's NLL
    and token count; over aligned positions the trained loss (``kd``, spans included), the
    forward KL of the bucketed distributions at T = 1 (``kl``, hybrid only) and top-1 agreement
    (the student's argmax is the twin of the teacher's); and the count of aligned positions."""
    forward = get_divergence("forward_kl")
    totals: dict[str, Tensor] = {}
    for student_logits, teacher, targets in chunks:
        student_logits = student_logits.to(math_dtype(student_logits.dtype))
        log_q = F.log_softmax(student_logits, -1)
        aligned = teacher.aligned
        first_matched = teacher.matched[:, 0] if teacher.matched.numel() else aligned
        target_log_q = log_q.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        kd = teacher.divergence(student_logits / temperature, divergence).sum() * temperature**2
        values = {
            "student_nll": -target_log_q.sum(),
            "tokens": torch.tensor(targets.numel(), device=targets.device),
            "kd": kd + teacher.span_divergence(target_log_q),
            "agreement": (
                aligned & first_matched & (student_logits.argmax(-1) == teacher.ids[:, 0])
            ).sum(),
            "aligned": aligned.sum(),
        }
        if teacher.loss != "uld" and temperature == 1.0:
            values["kl"] = torch.where(aligned, teacher._matched(log_q, forward), 0.0).sum()
        totals = {name: totals.get(name, 0) + value for name, value in values.items()}
    return totals
