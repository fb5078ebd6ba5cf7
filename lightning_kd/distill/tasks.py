"""What differs between distilling a causal LM and an encoder, as two small objects.

- :class:`CausalLM`: position t is scored against ``labels[t + 1]``; the logit terms (KD + CE)
  run from hidden states a chunk at a time (or from full logits with ``distill.chunked=false``);
  validation measures perplexities, agreement and KL.
- :class:`Encoder`: a bare encoder has no logits: every attended position is scored by the
  feature terms alone; validation measures the cosine of mean-pooled sentence embeddings.

The distiller asks its task these questions instead of branching on the model type. This module
imports torch and ``losses/`` only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.chunked import OutputHead, chunked_distillation_sums, logit_chunks
from lightning_kd.losses.cross_vocab import CrossTeacher, cross_evaluation_sums
from lightning_kd.losses.features import mean_pool
from lightning_kd.losses.logits import (
    IGNORE_INDEX,
    LogitObjective,
    LossSums,
    evaluation_sums,
    logit_distillation_sums,
    scored_mask,
    scored_next_token,
)
from lightning_kd.losses.topk import TopKTeacher, top_k_evaluation_sums

Heads = tuple[OutputHead, OutputHead]
"""``(student_head, teacher_head)``: the output projections the chunked loss applies."""

MetricSums = dict[str, tuple[Tensor, Tensor]]
"""Validation metric name → ``(sum, count)``; the metric is Σ sums / Σ counts over the set."""


class Task(Protocol):
    """What the distiller needs to know about the models' task."""

    name: str
    wants_logits: bool
    """Whether the models' forwards return full logits (else final hidden states)."""
    uses_heads: bool
    """Whether the loss applies the output heads to hidden states itself (the chunked path)."""

    def scored_mask(self, batch: dict[str, Tensor]) -> Tensor: ...

    def logit_terms(
        self,
        student: Tensor,
        teacher: Tensor | None,
        batch: dict[str, Tensor],
        heads: Heads | None,
        ce: bool = True,
        kd_scale: float = 1.0,
    ) -> tuple[Tensor, LossSums]: ...

    def metric_sums(
        self, student: Tensor, teacher: Tensor, batch: dict[str, Tensor], heads: Heads | None
    ) -> MetricSums: ...


class CausalLM:
    """Next-token prediction: logit KD and CE on the positions that predict a label."""

    name = "causal_lm"

    def __init__(
        self, objective: LogitObjective, chunked: bool, chunk_size: int | None, compile: bool
    ) -> None:
        self.objective = objective
        self.chunked, self.chunk_size, self.compile = chunked, chunk_size, compile
        self.wants_logits = not chunked
        self.uses_heads = chunked

    def scored_mask(self, batch: dict[str, Tensor]) -> Tensor:
        """``[batch, seq]``: position t counts when it predicts a label (``labels[t + 1]``)."""
        return scored_mask(batch["labels"])

    def logit_terms(
        self,
        student: Tensor,
        teacher: Tensor | TopKTeacher | None,
        batch: dict[str, Tensor],
        heads: Heads | None,
        ce: bool = True,
        kd_scale: float = 1.0,
    ) -> tuple[Tensor, LossSums]:
        """The weighted KD + CE token sum (differentiable) and its parts; ``teacher=None`` for a
        CE-only step, a cached teacher's records (chunked path only) in place of its output.
        ``ce=False`` leaves the CE term out of the sum (still reported in the parts): the
        student's own sampled completions, whose CE has no expected gradient (on_policy.py), or
        a second teacher's term. ``kd_scale`` weighs the KD term (one teacher of several)."""
        objective = self.objective if ce else replace(self.objective, ce_weight=0.0)
        if kd_scale != 1.0:
            objective = replace(objective, kd_weight=objective.kd_weight * kd_scale)
        if self.chunked:
            value, sums = chunked_distillation_sums(
                student,
                heads[0],
                teacher,
                heads[1],
                batch["labels"],
                objective,
                chunk_size=self.chunk_size,
                compile=self.compile,
            )
        else:
            sums = logit_distillation_sums(
                student,
                teacher,
                batch["labels"],
                self.objective.divergence,
                self.objective.temperature,
            )
            value = objective.combine(sums.kd, sums.ce)
        sums.ce_trained = ce
        return value, sums

    def metric_sums(
        self, student: Tensor, teacher: Tensor, batch: dict[str, Tensor], heads: Heads | None
    ) -> MetricSums:
        """Perplexities, top-1 agreement, KL and the objective's logit terms, as token sums."""
        labels = batch["labels"]
        if isinstance(teacher, CrossTeacher):
            return self.cross_metric_sums(student, teacher, labels, heads)
        cached = isinstance(teacher, TopKTeacher)
        if self.chunked:
            chunks = logit_chunks(student, heads[0], teacher, heads[1], labels, self.chunk_size)
        else:
            student_logits, targets = scored_next_token(student, labels)
            chunks = [(student_logits, scored_next_token(teacher, labels)[0], targets)]
        sums_of = top_k_evaluation_sums if cached else evaluation_sums
        sums = sums_of(chunks, self.objective.divergence, self.objective.temperature)
        tokens = sums.tokens
        metrics = {
            "ppl": (sums.student_nll, tokens),
            "teacher_ppl": (sums.teacher_nll, tokens),
            "kl": (sums.forward_kl, tokens),
            "agreement": (sums.agreement, tokens),
            "loss": (self.objective.combine(sums.kd, sums.student_nll), tokens),
        }
        if cached and self.objective.temperature != 1.0:
            del metrics["kl"]  # the records hold the teacher at T alone, not at 1
        return metrics

    def cross_metric_sums(
        self, student: Tensor, teacher: CrossTeacher, labels: Tensor, heads: Heads
    ) -> MetricSums:
        """:meth:`metric_sums` against a teacher with another tokenizer: its perplexity is over
        other tokens (``teacher_bpb`` stands in, ``cross_tokenizer.py``); agreement and KL are
        over the positions aligned with it, whose share is ``aligned``."""
        chunks = logit_chunks(student, heads[0], teacher, None, labels, self.chunk_size)
        sums = cross_evaluation_sums(chunks, self.objective.divergence, self.objective.temperature)
        tokens, aligned = sums["tokens"], sums["aligned"]
        metrics = {
            "ppl": (sums["student_nll"], tokens),
            "agreement": (sums["agreement"], aligned),
            "aligned": (aligned, tokens),
            "loss": (self.objective.combine(sums["kd"], sums["student_nll"]), tokens),
        }
        if "kl" in sums:
            metrics["kl"] = (sums["kl"], aligned)
        return metrics


class Encoder:
    """A bare encoder (no head): feature matching only, scored on every attended position."""

    name = "encoder"
    wants_logits = False
    uses_heads = False

    def scored_mask(self, batch: dict[str, Tensor]) -> Tensor:
        """Every attended position; a row whose labels are all −100 (the padding that evens out
        validation across ranks) scores nothing."""
        attended = batch["attention_mask"].bool()
        if "labels" not in batch:
            return attended
        return attended & (batch["labels"] != IGNORE_INDEX).any(dim=-1, keepdim=True)

    def logit_terms(
        self,
        student: Tensor,
        teacher: Tensor | None,
        batch: dict[str, Tensor],
        heads: Heads | None,
        ce: bool = True,
        kd_scale: float = 1.0,
    ) -> tuple[Tensor, LossSums]:
        """No logits: zero, with the scored token count (the features' denominator)."""
        zero = student.new_zeros((), dtype=torch.float32)
        return zero, LossSums(kd=zero, ce=zero, tokens=self.scored_mask(batch).sum())

    def metric_sums(
        self, student: Tensor, teacher: Tensor, batch: dict[str, Tensor], heads: Heads | None
    ) -> MetricSums:
        """Cosine of mean-pooled sentence embeddings, per passage; none for a student of
        another width, whose embeddings are in another space (it was a torch error in the first
        validation; its features still train, through projectors)."""
        if student.shape[-1] != teacher.shape[-1]:
            return {}
        attention = batch["attention_mask"]
        cosine = F.cosine_similarity(
            mean_pool(student, attention), mean_pool(teacher, attention), dim=-1
        )
        scored = self.scored_mask(batch).any(dim=-1)  # passages, not the unscored padding rows
        return {"embedding_cosine": (cosine[scored].sum(), scored.sum())}


def bits_per_byte(labels: Tensor, lengths: Tensor | None, metrics: MetricSums) -> MetricSums:
    """The student's (and a same-tokenizer teacher's) bits per byte of the scored text: the NLL
    in bits over the bytes the scored next tokens spell (``lengths``: bytes per student id),
    comparable across tokenizers where perplexities are not. Empty without ``lengths``."""
    if lengths is None or "ppl" not in metrics:
        return {}
    targets = labels[:, 1:]
    lengths = lengths.to(targets.device)
    text_bytes = lengths[targets[targets != IGNORE_INDEX].clamp(max=len(lengths) - 1)].sum()
    sums = {"bpb": (metrics["ppl"][0] / math.log(2), text_bytes)}
    if "teacher_ppl" in metrics:
        sums["teacher_bpb"] = (metrics["teacher_ppl"][0] / math.log(2), text_bytes)
    return sums


def make_task(
    name: str,
    objective: LogitObjective,
    chunked: bool = True,
    chunk_size: int | None = None,
    compile: bool = False,
) -> Task:
    """The task object for ``teacher.task``: ``causal_lm`` or ``encoder``."""
    if name == "causal_lm":
        return CausalLM(objective, chunked, chunk_size, compile)
    if name == "encoder":
        return Encoder()
    raise ValueError(f"teacher.task={name!r}; choose causal_lm or encoder")
