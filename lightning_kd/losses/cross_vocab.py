"""Logit distillation across vocabularies: a teacher whose tokenizer is not the student's.

At a student position aligned with a teacher position (``data/alignment.py``: both have read the
same text and predict what follows it), the teacher's distribution over *its* vocabulary is kept as
its top k tokens (:func:`cross_records`, a chunk of positions at a time: no
``[positions, teacher_vocab]`` tensor outlives its chunk). Two losses compare it with the
student's distribution over the student's vocabulary:

- ``uld`` (Universal Logit Distillation, Boizard et al. 2024): the Wasserstein-1 distance between
  the two distributions with every token at unit distance from every other, which is the L1
  distance between the *sorted* probability vectors — no token correspondence needed, so no
  vocabulary agreement used either. Here over each side's top k (the rest, zeros).
- ``hybrid`` (in the spirit of TRL's GOLD): the teacher tokens that spell the same bytes as a
  student token (``alignment.vocabulary_map``: " the" in both, the document end in both) are
  compared by the run's divergence, on the distributions bucketed into those tokens plus "any
  other token" (as a top-k cache is, ``losses/topk.py``); the teacher's top-k tokens with no
  student twin are compared with the student's tokens that have no teacher twin by ULD, weighted
  ``uld_weight``. With identical tokenizers and k = vocabulary every token matches, the ULD part
  is 0 and the bucketed divergence *is* the same-tokenizer divergence.
- ``projected``: every teacher token is credited to the student token the student's tokenizer
  starts its text with (``alignment.first_token_map``: Gemma's "▁understanding" to SmolLM2's
  " under" where that is how SmolLM2 spells it), the teacher's top-k mass summed per student
  token — its next-token distribution projected onto the student's vocabulary — and the run's
  divergence compares the two over the projection's top k plus "any other token". No mass is
  lost to tokens without an exact twin.

Positions with no partner add nothing to the divergence (their CE stays). Everything here is a pure
function of tensors; :class:`CrossTeacher` plays the part a cached teacher's
:class:`~lightning_kd.losses.topk.TopKTeacher` plays in the chunked loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.divergences import TokenDivergence, get_divergence
from lightning_kd.losses.logits import math_dtype
from lightning_kd.losses.topk import target_log_prob

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

    def _map(self, take) -> CrossTeacher:
        fields = ("ids", "log_probs", "matched", "tail", "top_probs", "aligned")
        return CrossTeacher(
            **{name: take(getattr(self, name)) for name in fields},
            student_twins=self.student_twins,
            loss=self.loss,
            uld_weight=self.uld_weight,
        )

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
        return divergence(student, teacher)

    def _unmatched(self, log_q: Tensor) -> Tensor:
        """ULD between the teacher's top-k tokens with no student twin and the student's tokens
        with no teacher twin."""
        teacher = self.top_probs.to(log_q.dtype).masked_fill(self.matched, 0.0)
        student = log_q.exp().masked_fill(self.student_twins[: log_q.shape[-1]], 0.0)
        return sorted_l1(student, teacher)


def sorted_l1(student_probs: Tensor, teacher_top: Tensor) -> Tensor:
    """``Σ_i |sort(q)_i − sort(p)_i|`` over the k largest of each (k = ``teacher_top``'s width):
    ULD's Wasserstein-1 distance at unit transport cost, truncated to the top k."""
    k = min(teacher_top.shape[-1], student_probs.shape[-1])
    student_top = student_probs.topk(k, dim=-1).values
    teacher_sorted = teacher_top.sort(dim=-1, descending=True).values[..., :k]
    return (student_top - teacher_sorted).abs().sum(-1)


def twins(mapping: Tensor, student_vocab: int) -> Tensor:
    """``[student_vocab]``: the student ids some teacher id maps to (``vocabulary_map``)."""
    present = torch.zeros(student_vocab, dtype=torch.bool, device=mapping.device)
    hits = mapping[mapping >= 0]
    present[hits[hits < student_vocab]] = True
    return present


@torch.no_grad()
def cross_records(
    teacher_logits_of,
    positions: Tensor,
    mapping: Tensor,
    student_twins: Tensor,
    *,
    k: int,
    temperature: float,
    chunk: int,
    loss: str = "hybrid",
    uld_weight: float = 1.0,
    targets: Tensor | None = None,
) -> tuple[CrossTeacher, Tensor]:
    """The teacher's records at ``positions`` (``[n]`` indices into its flattened positions, each
    aligned with a student position), ``chunk`` positions at a time, and its summed
    NLL (T = 1) of ``targets`` (``[n]`` next-token ids, −1 where none counts; 0 without them):
    one pass of the teacher's head serves both.

    ``teacher_logits_of(index)`` returns the teacher's logits ``[len(index), teacher_vocab]`` of
    those flattened positions; ``mapping`` is ``vocabulary_map``'s ``[teacher_vocab]``.
    """
    if loss not in LOSSES:
        raise ValueError(f"distill.cross_loss={loss!r}; choose one of {list(LOSSES)}")
    parts = []
    nll = torch.zeros((), dtype=torch.float64, device=student_twins.device)
    for start in range(0, positions.numel(), chunk):
        logits = teacher_logits_of(positions[start : start + chunk])
        if loss == "projected":
            parts.append(_projected(logits, mapping, k, temperature, student_twins.numel()))
        else:
            parts.append(_records(logits, mapping, k, temperature))
        if targets is not None:
            counted = targets[start : start + chunk] >= 0
            picked = targets[start : start + chunk][counted]
            nll -= target_log_prob(logits[counted].double(), picked).sum()
    device = student_twins.device
    if parts:
        columns = [torch.cat(column) for column in zip(*parts, strict=True)]
    else:
        columns = [
            torch.zeros((0, k), dtype=dtype, device=device)
            for dtype in (torch.long, torch.float32, torch.bool, torch.float32)
        ]
        columns.insert(3, torch.zeros(0, device=device))
    ids, log_probs, matched, tail, top_probs = columns
    aligned = torch.ones(len(ids), dtype=torch.bool, device=ids.device)
    records = CrossTeacher(
        ids, log_probs, matched, tail, top_probs, aligned, student_twins, loss, uld_weight
    )
    return records, nll


def _mapped_top(
    logits: Tensor, mapping: Tensor, k: int, temperature: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The teacher's top-k log-probabilities at T, their ids through ``mapping`` (−1: none),
    which have one, and the log of the mass outside those mapped top-k tokens — summed over
    itself, not 1 − Σ mapped (which cancels to nothing when they hold nearly everything)."""
    log_p = F.log_softmax(logits.to(math_dtype(logits.dtype)) / temperature, -1)
    top, teacher_ids = log_p.topk(min(k, log_p.shape[-1]), dim=-1)
    student_ids = mapping.to(logits.device)[teacher_ids]
    mapped = student_ids >= 0
    outside = log_p.scatter(-1, teacher_ids, top.masked_fill(mapped, float("-inf")))
    return top, student_ids, mapped, torch.logsumexp(outside, -1)


def _records(logits: Tensor, mapping: Tensor, k: int, temperature: float) -> tuple[Tensor, ...]:
    """One chunk's ``(ids, log_probs, matched, tail, top_probs)``."""
    top, student_ids, matched, outside = _mapped_top(logits, mapping, k, temperature)
    tail = outside.clamp(min=FLOOR)
    return (
        student_ids.clamp(min=0),
        top.masked_fill(~matched, FLOOR),
        matched,
        tail,
        top.exp(),
    )


def _projected(
    logits: Tensor, mapping: Tensor, k: int, temperature: float, student_vocab: int
) -> tuple[Tensor, ...]:
    """One chunk's records of the teacher's top-k mass summed per student token (``mapping``
    many to one), the projection's own top k kept."""
    top, student_ids, mapped, outside = _mapped_top(logits, mapping, k, temperature)
    mass = top.exp() * mapped
    dense = mass.new_zeros(len(mass), student_vocab).scatter_add_(1, student_ids.clamp(min=0), mass)
    projected, ids = dense.topk(min(k, student_vocab), dim=-1)
    matched = projected > 0
    # The tail: the teacher's mass outside its mapped top k, and what of that top k fell outside
    # the projection's top k.
    dropped = (mass.sum(-1) - projected.sum(-1)).clamp(min=0)
    tail = torch.logaddexp(outside, dropped.log()).clamp(min=FLOOR)
    log_probs = projected.clamp(min=1e-38).log().masked_fill(~matched, FLOOR)
    return ids, log_probs, matched, tail, top.exp()


def cross_evaluation_sums(
    chunks, divergence: TokenDivergence, temperature: float = 1.0
) -> dict[str, Tensor]:
    """Validation sums of ``(student_logits, CrossTeacher, targets)`` chunks: the student's NLL
    and token count; over aligned positions the trained loss (``kd``), the forward KL of the
    bucketed distributions at T = 1 (``kl``, hybrid only) and top-1 agreement (the student's
    argmax is the twin of the teacher's); and the count of aligned positions."""
    forward = get_divergence("forward_kl")
    totals: dict[str, Tensor] = {}
    for student_logits, teacher, targets in chunks:
        student_logits = student_logits.to(math_dtype(student_logits.dtype))
        log_q = F.log_softmax(student_logits, -1)
        aligned = teacher.aligned
        first_matched = teacher.matched[:, 0] if teacher.matched.numel() else aligned
        values = {
            "student_nll": -log_q.gather(-1, targets.unsqueeze(-1)).sum(),
            "tokens": torch.tensor(targets.numel(), device=targets.device),
            "kd": teacher.divergence(student_logits / temperature, divergence).sum()
            * temperature**2,
            "agreement": (
                aligned & first_matched & (student_logits.argmax(-1) == teacher.ids[:, 0])
            ).sum(),
            "aligned": aligned.sum(),
        }
        if teacher.loss != "uld" and temperature == 1.0:
            values["kl"] = torch.where(aligned, teacher._matched(log_q, forward), 0.0).sum()
        totals = {name: totals.get(name, 0) + value for name, value in values.items()}
    return totals
