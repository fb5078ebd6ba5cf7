"""Logit distillation from final hidden states, a chunk of tokens at a time.

The full-logit path materialises ``[tokens, vocab]`` logits for both models, their softmaxes and the
student's logit gradient — several vocab-sized tensors per token, most of a KD step's memory when
the vocabulary is large. Here each chunk of ``chunk_size`` tokens goes through the output heads,
the divergence and the cross-entropy, and the gradients with respect to the student's hidden
states and head weights are computed *in the forward loop* (as Liger Kernel's ``chunked_loss``
does). Backward then only scales those stored gradients: the head matmul is never recomputed and no
vocab-sized tensor outlives its chunk.

Each chunk's numbers come from :mod:`lightning_kd.losses.chunk_terms`: a closed form for forward and
reverse KL, autograd on the chunk's logits for every other divergence of
:mod:`lightning_kd.losses.divergences`, so a new divergence needs no hand-written gradient.

Numerics: the head matmuls run in the ambient autocast dtype (bf16 under ``bf16-mixed``) like the
model's own head would; the softmaxes and divergences run in fp32 (fp64 when the inputs are fp64);
the head-weight gradient is accumulated in the matmul dtype a few chunks at a time and then in the
weights' (:class:`HeadGradient`): fp32 (fp64) throughout without autocast; under ``bf16-mixed``,
in-place ``addmm_`` into bf16 for :attr:`HeadGradient.FLUSH` chunks, each such sum added to fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.chunk_terms import chunk_autograd, chunk_fused
from lightning_kd.losses.cross_spans import chunk_bounds
from lightning_kd.losses.cross_vocab import CrossTeacher
from lightning_kd.losses.head_gradient import HeadGradient
from lightning_kd.losses.logits import (
    LogitObjective,
    LossSums,
    math_dtype,
    next_token_targets,
    scored_next_token,
)
from lightning_kd.losses.topk import TopKTeacher

CHUNK_ELEMENTS = 1 << 23
"""Automatic chunk size: about 8M logits (32 MB in fp32) per model per chunk. Smaller chunks
spend more time re-reading the head weights and accumulating their gradient; larger ones hold
more memory (and on the CPU leave glibc's 32 MB mmap threshold, so every chunk page-faults)."""

LogitTransform = Callable[[Tensor], Tensor]

Records = TopKTeacher | CrossTeacher
"""A teacher given as records of the scored positions instead of hidden states: a top-k cache's,
or a teacher with another tokenizer's at aligned positions."""


@dataclass
class OutputHead:
    """A model's output projection: ``logits = transform(hidden @ weight.T + bias)``."""

    weight: Tensor
    bias: Tensor | None = None
    transform: LogitTransform | None = None
    """Applied to raw logits (soft-capping, scaling) as the model itself does; None for most."""

    def cast(self, dtype: torch.dtype) -> OutputHead:
        """The same head with detached weights in ``dtype``: cast once, not once per chunk."""
        bias = None if self.bias is None else self.bias.detach().to(dtype)
        return OutputHead(self.weight.detach().to(dtype), bias, self.transform)

    def logits(self, hidden: Tensor, dtype: torch.dtype) -> Tensor:
        """Logits of ``hidden`` with the matmul in ``dtype``."""
        bias = None if self.bias is None else self.bias.to(dtype)
        logits = F.linear(hidden.to(dtype), self.weight.to(dtype), bias)
        return logits if self.transform is None else self.transform(logits)


def auto_chunk_size(vocab: int, tokens: int) -> int:
    """Tokens per chunk so that one chunk's logits hold about :data:`CHUNK_ELEMENTS` values."""
    return max(1, min(tokens, CHUNK_ELEMENTS // max(vocab, 1)))


def matmul_dtype(reference: Tensor) -> torch.dtype:
    """The dtype a linear layer would compute in here: autocast's when it is on."""
    device_type = reference.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return reference.dtype


@dataclass(frozen=True)
class ChunkedLoss:
    """How the chunked loss runs: the objective, the chunk length, whether to compile."""

    objective: LogitObjective
    chunk_size: int
    """Scored tokens per chunk."""
    compile: bool = False
    """Run the fused chunk math through ``torch.compile``."""


def _chunk_gradient(
    hidden: Tensor,
    teacher: Tensor | Records | None,
    targets: Tensor,
    head: OutputHead,
    teacher_head: OutputHead | None,
    options: ChunkedLoss,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """One chunk's KD and CE sums, the objective's gradient w.r.t. its raw student logits
    (``hidden`` and the heads already in the matmul dtype) and the span term's part of KD (None
    without one). ``teacher``: the teacher's hidden states, a cached teacher's top-k records, or
    None (CE only)."""
    dtype = hidden.dtype
    with torch.no_grad():
        logits = head.logits(hidden, dtype)
        teacher_logits = teacher
        if isinstance(teacher, Tensor):
            teacher_logits = teacher_head.logits(teacher, dtype)
    # A copy, not a view: a view's base size would make torch.compile specialise on it.
    targets = targets.clone()
    objective = options.objective
    fused = getattr(objective.divergence, "fused", None)
    if isinstance(teacher, TopKTeacher):  # the top-k closed form is forward KL's alone
        fused = fused if objective.divergence.name == "forward_kl" else None
    if isinstance(teacher, CrossTeacher):  # sorting and bucketing: autograd's
        fused = None
    if fused is not None and head.transform is None:
        sums = chunk_fused(logits, teacher_logits, targets, objective, options.compile)
    else:
        sums = chunk_autograd(logits, teacher_logits, targets, objective)
    kd, ce, grad, span = sums
    if head.transform is not None:  # chain through soft-capping/scaling to the raw logits
        with torch.enable_grad():
            raw = F.linear(hidden, head.weight, head.bias).requires_grad_()
            (grad,) = torch.autograd.grad(head.transform(raw), raw, grad)
    return kd, ce, grad.to(dtype), span


def _bounds(total: int, size: int, teacher) -> list[tuple[int, int]]:
    """The chunks of ``total`` scored tokens: a cross-tokenizer teacher's spans stay whole."""
    spans = isinstance(teacher, CrossTeacher) and teacher.span_weight > 0
    return chunk_bounds(total, size, teacher.span if spans else None)


class _ChunkedDistillation(torch.autograd.Function):
    """Forward: loss sums and their gradients, chunk by chunk. Backward: scale the gradients."""

    @staticmethod
    def forward(
        ctx,
        student_hidden: Tensor,
        student_weight: Tensor,
        student_bias: Tensor | None,
        teacher_hidden: Tensor | Records | None,
        heads: tuple[OutputHead, OutputHead | None],
        targets: Tensor,
        options: ChunkedLoss,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        # The weight and bias come in as inputs (as well as inside the head) so that autograd
        # routes their gradients; the head supplies the transform.
        objective = options.objective
        dtype = matmul_dtype(student_hidden)
        accumulate = math_dtype(student_weight.dtype)
        head = heads[0].cast(dtype)
        weight = head.weight
        teacher_head = heads[1].cast(dtype) if isinstance(teacher_hidden, Tensor) else None
        grad_hidden = torch.zeros_like(student_hidden)
        # A frozen head (student.freeze_embeddings) needs no weight gradient: skipping it saves
        # one of the three vocab-sized matmuls of each chunk.
        grad_weight = HeadGradient(student_weight, dtype) if student_weight.requires_grad else None
        trains_bias = student_bias is not None and student_bias.requires_grad
        grad_bias = torch.zeros_like(student_bias, dtype=accumulate) if trains_bias else None
        kd_total = torch.zeros((), dtype=accumulate, device=student_hidden.device)
        ce_total, span_total = torch.zeros_like(kd_total), torch.zeros_like(kd_total)
        for start, stop in _bounds(student_hidden.shape[0], options.chunk_size, teacher_hidden):
            hidden = student_hidden[start:stop].detach().to(dtype)
            teacher_chunk = None if teacher_hidden is None else teacher_hidden[start:stop]
            kd, ce, grad_logits, span = _chunk_gradient(
                hidden, teacher_chunk, targets[start:stop], head, teacher_head, options
            )
            if span is not None:
                span_total += span
            grad_hidden[start:stop] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.add(grad_logits, hidden)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
            kd_total += kd
            ce_total += ce
        # Attributes, not save_for_backward: backward drops its reference, so autograd can hand
        # the head's gradient buffer straight to ``.grad`` instead of copying a vocab-sized tensor.
        grad_weight = None if grad_weight is None else grad_weight.total()
        ctx.gradients = (grad_hidden, grad_weight, grad_bias)
        ctx.weight_dtype = student_weight.dtype
        ctx.mark_non_differentiable(kd_total, ce_total, span_total)
        return objective.combine(kd_total, ce_total), kd_total, ce_total, span_total

    @staticmethod
    def backward(ctx, grad_objective: Tensor, *_unused: Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.gradients
        del ctx.gradients
        # In place: these buffers are ours, and a vocab-sized copy here is a step's peak memory.
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_objective).to(ctx.weight_dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.mul_(grad_objective).to(ctx.weight_dtype)
        grad_hidden = grad_hidden.mul_(grad_objective.to(grad_hidden.dtype))
        # One gradient per input of forward; teacher_hidden, heads, targets and options get none.
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def chunked_distillation_sums(
    student_hidden: Tensor,
    student_head: OutputHead,
    teacher_hidden: Tensor | Records | None,
    teacher_head: OutputHead | None,
    labels: Tensor,
    objective: LogitObjective,
    *,
    chunk_size: int | None = None,
    compile: bool = False,
) -> tuple[Tensor, LossSums]:
    """The objective ``kd_weight·Σ KD + ce_weight·Σ CE`` (differentiable) and its parts.

    ``student_hidden``/``teacher_hidden`` are final hidden states ``[batch, seq, hidden]`` (after
    the final norm), ``labels`` ``[batch, seq]`` aligned with the inputs (shifted here, ``-100``
    masked). Gradients reach ``student_hidden`` and the student head's weight and bias.
    ``teacher_hidden=None`` skips the teacher (the divergence term is then 0: CE-only training);
    :data:`Records` of positions 0 .. seq − 2 (a cached teacher's top k, or a teacher with another
    tokenizer's records at aligned positions) take its place, with no teacher head.
    ``chunk_size`` is in scored tokens (None: about 8M logits a chunk); ``compile`` runs the
    chunk math through ``torch.compile``.
    """
    student_hidden, targets = scored_next_token(student_hidden, labels)
    if isinstance(teacher_hidden, Records):  # records of positions 0 .. seq−2
        teacher_hidden = teacher_hidden.select(next_token_targets(labels)[1])
    elif teacher_hidden is not None:
        teacher_hidden = scored_next_token(teacher_hidden, labels)[0]
    tokens = torch.tensor(targets.numel(), device=targets.device)
    if chunk_size is None:
        chunk_size = auto_chunk_size(student_head.weight.shape[0], max(1, targets.numel()))
    if chunk_size < 1:
        raise ValueError(f"distill.chunk_size={chunk_size}; use a positive number or auto")
    spans = isinstance(teacher_hidden, CrossTeacher) and bool(teacher_hidden.span_weight)
    value, kd, ce, span = _ChunkedDistillation.apply(
        student_hidden,
        student_head.weight,
        student_head.bias,
        teacher_hidden,
        (student_head, teacher_head),
        targets,
        ChunkedLoss(objective, chunk_size, compile),
    )
    return value, LossSums(kd=kd, ce=ce, tokens=tokens, span=span if spans else None)


@torch.no_grad()
def logit_chunks(
    student_hidden: Tensor,
    student_head: OutputHead,
    teacher_hidden: Tensor | Records,
    teacher_head: OutputHead | None,
    labels: Tensor,
    chunk_size: int | None = None,
) -> Iterator[tuple[Tensor, Tensor | Records, Tensor]]:
    """``(student_logits, teacher_logits, targets)`` of the scored tokens, a chunk at a time
    (a cached teacher's records in place of its logits).

    For evaluation (no gradients): feed it to :func:`lightning_kd.losses.logits.evaluation_sums`
    (:func:`lightning_kd.losses.topk.top_k_evaluation_sums` for records).
    """
    student_hidden, targets = scored_next_token(student_hidden, labels)
    cached = isinstance(teacher_hidden, Records)
    if cached:
        teacher_hidden = teacher_hidden.select(next_token_targets(labels)[1])
    else:
        teacher_hidden = scored_next_token(teacher_hidden, labels)[0]
    chunk_size = chunk_size or auto_chunk_size(student_head.weight.shape[0], targets.numel())
    dtype = matmul_dtype(student_hidden)
    student_head = student_head.cast(dtype)
    teacher_head = None if cached else teacher_head.cast(dtype)
    accumulate = math_dtype(student_head.weight.dtype)
    for start, stop in _bounds(targets.numel(), chunk_size, teacher_hidden) or [(0, 0)]:
        teacher = teacher_hidden[start:stop]
        yield (
            student_head.logits(student_hidden[start:stop], dtype).to(accumulate),
            teacher if cached else teacher_head.logits(teacher, dtype).to(accumulate),
            targets[start:stop],
        )
