"""One chunk's logit terms and their gradient w.r.t. the student's logits.

:mod:`lightning_kd.losses.chunked` cuts the scored tokens into chunks and owns the gradient
bookkeeping; this module supplies each chunk's numbers, by one of two routes:

- **fused**: a divergence with a closed-form gradient (forward and reverse KL) computes value and
  gradient from log-sum-exps in a few passes over the chunk, optionally through ``torch.compile``;
- **autograd**: any other divergence (or a chunk with −inf logits) is differentiated by autograd on
  the chunk's logits, so a new divergence needs no hand-written gradient.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.cross_vocab import CrossTeacher
from lightning_kd.losses.divergences import FusedDivergence, TokenDivergence
from lightning_kd.losses.logits import LogitObjective, math_dtype, shared_vocab
from lightning_kd.losses.topk import TopKTeacher


def _chunk_terms(
    student_logits: Tensor,
    teacher_logits: Tensor | TopKTeacher | CrossTeacher | None,
    targets: Tensor,
    divergence: TokenDivergence,
    temperature: float,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Summed T²-scaled divergence and cross-entropy of one chunk (logits in math dtype), and
    the span term inside that divergence (None without one), for its own report.

    Without teacher logits (a CE-only run skips the teacher) the divergence term is 0; a cached
    teacher's top-k records give the divergence of the bucketed distributions (``losses.topk``),
    a teacher with another tokenizer its records at aligned positions (``losses.cross_vocab``).
    """
    nll = F.cross_entropy(student_logits, targets, reduction="none")
    ce = nll.sum()
    if teacher_logits is None:
        return torch.zeros_like(ce), ce, None
    if isinstance(teacher_logits, TopKTeacher | CrossTeacher):
        kd = teacher_logits.divergence(student_logits / temperature, divergence)
        kd = kd.sum() * temperature**2
        span = None
        if isinstance(teacher_logits, CrossTeacher) and teacher_logits.has_span_term:
            span = teacher_logits.span_divergence(-nll)  # spans at T = 1: text likelihoods
            kd = kd + span
        return kd, ce, span
    student_logits, teacher_logits = shared_vocab(student_logits, teacher_logits)
    student_logp = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits / temperature, dim=-1)
    kd = divergence(student_logp, teacher_logp).sum() * temperature**2
    return kd, ce, None


def chunk_autograd(
    logits: Tensor,
    teacher_logits: Tensor | TopKTeacher | None,
    targets: Tensor,
    objective: LogitObjective,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Summed KD and CE of one chunk, the objective's gradient w.r.t. ``logits``, by autograd,
    and the span term inside KD (None without one)."""
    dtype = math_dtype(logits.dtype)
    if isinstance(teacher_logits, Tensor):
        teacher_logits = teacher_logits.to(dtype)
    with torch.enable_grad():
        logits = logits.detach().to(dtype).requires_grad_()
        kd, ce, span = _chunk_terms(
            logits, teacher_logits, targets, objective.divergence, objective.temperature
        )
        (grad,) = torch.autograd.grad(objective.combine(kd, ce), logits)
    return kd.detach(), ce.detach(), grad, None if span is None else span.detach()


def _fused_terms(
    logits: Tensor,
    teacher_logits: Tensor | None,
    targets: Tensor,
    fused: FusedDivergence,
    scales: Tensor,
    tempered: bool,
) -> tuple[Tensor | None, Tensor, Tensor]:
    """Per-token divergence, summed CE and the objective's gradient w.r.t. ``logits``.

    Pure tensor code (what ``distill.compile`` hands to ``torch.compile``): logits come in the
    matmul dtype, the math runs in fp32 (fp64 for fp64 inputs), the gradient goes back out in
    the logits' dtype. ``scales`` holds the temperature, the KD and the CE weight (see
    :func:`_scales`); ``tempered``: the temperature is not 1. CE's gradient is softmax − one-hot;
    the divergence's is w.r.t. the logits at temperature T, so the chain rule adds 1/T and the T²
    scale leaves a factor T. At T = 1 the student's log-sum-exp is shared by both terms.
    """
    temperature, kd_weight, ce_weight = scales.unbind()
    student = logits.to(math_dtype(logits.dtype))
    lse = torch.logsumexp(student, dim=-1, keepdim=True)
    ce = (lse.squeeze(-1) - student.gather(1, targets.unsqueeze(1)).squeeze(-1)).sum()
    grad = (student - lse).exp() * ce_weight
    grad = grad.scatter_add(1, targets.unsqueeze(1), _minus(ce_weight, grad, len(targets)))
    if teacher_logits is None:
        return None, ce, grad.to(logits.dtype)
    shared, teacher = shared_vocab(student, teacher_logits.to(student.dtype))
    vocab = shared.shape[-1]
    if tempered:
        shared, teacher = shared / temperature, teacher / temperature
    same = not tempered and vocab == logits.shape[-1]
    student_lse = lse if same else torch.logsumexp(shared, dim=-1, keepdim=True)
    teacher_lse = torch.logsumexp(teacher, dim=-1, keepdim=True)
    value, divergence_grad = fused(shared, teacher, student_lse, teacher_lse)
    grad[:, :vocab] += (kd_weight * temperature) * divergence_grad
    return value, ce, grad.to(logits.dtype)


def _top_k_fused_terms(
    logits: Tensor,
    teacher: TopKTeacher,
    targets: Tensor,
    scales: Tensor,
    tempered: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_fused_terms` for forward KL from a cached teacher's top-k records (``losses.topk``).

    The bucketed forward KL is ``Σ_S p_i (log p_i − log q_i) + r (log r − log q_tail)``; its
    gradient w.r.t. the student's logits at T is ``q_j (Σ_S p + r) − p̃_j`` with ``p̃_j = p_j`` on
    the top k and ``r · q_j / q_tail`` elsewhere: the teacher's tail mass spread as the student
    spreads its own. With k = vocabulary the tail terms vanish and this is full forward KL.
    """
    temperature, kd_weight, ce_weight = scales.unbind()
    student = logits.to(math_dtype(logits.dtype))
    lse = torch.logsumexp(student, dim=-1, keepdim=True)
    ce = (lse.squeeze(-1) - student.gather(1, targets.unsqueeze(1)).squeeze(-1)).sum()
    vocab, ids = teacher.vocab, teacher.ids
    shared = student[:, :vocab] / temperature if tempered else student[:, :vocab]
    same = not tempered and vocab == student.shape[-1]
    log_q = shared - (lse if same else torch.logsumexp(shared, dim=-1, keepdim=True))
    q = log_q.exp()
    # Vocab-sized tensors are few and reused in place: this runs where memory is the point.
    grad = q * ce_weight if same else (student - lse).exp_().mul_(ce_weight)
    grad.scatter_add_(1, targets.unsqueeze(1), _minus(ce_weight, grad, len(targets)))
    log_p = teacher.log_probs.to(student.dtype)
    p = log_p.exp()
    value = (p * (log_p - log_q.gather(1, ids))).sum(-1)
    q_top = q.gather(1, ids)
    coefficient = p.sum(-1)  # of q_j in the gradient; and −p_j added on the top k
    top = -p
    if not teacher.covers_vocab:
        log_r = teacher.tail.to(student.dtype)
        log_q_tail = torch.logsumexp(log_q.scatter_(1, ids, float("-inf")), dim=-1)
        has_tail = torch.isfinite(log_r)
        value = value + torch.where(has_tail, log_r.exp() * (log_r - log_q_tail), 0.0)
        spread = torch.where(has_tail, (log_r - log_q_tail).exp(), 0.0)  # r / q_tail
        coefficient = coefficient + torch.where(has_tail, log_r.exp(), 0.0) - spread
        top = top + spread.unsqueeze(-1) * q_top
    del log_q
    divergence_grad = q.mul_(coefficient.unsqueeze(-1)).scatter_add_(1, ids, top)
    grad[:, :vocab].add_(divergence_grad.mul_(kd_weight * temperature))
    return value, ce, grad.to(logits.dtype)


def _minus(weight: Tensor, like: Tensor, rows: int) -> Tensor:
    """``-weight`` as a ``[rows, 1]`` column in ``like``'s dtype: the one-hot part of CE's
    gradient, scattered onto the targets."""
    return (-weight).to(like.dtype).expand(rows, 1)


def _scales(objective: LogitObjective, like: Tensor) -> tuple[Tensor, bool]:
    """The temperature, KD and CE weights as one tensor on ``like``'s device, and whether the
    temperature is not 1 (a Python bool beside the tensor: it chooses the code path, which a
    tensor's value could not do without a graph break).

    A tensor, not Python floats, because ``torch.compile(dynamic=True)`` turns float arguments
    into symbols it does not guard on, and torch 2.13 bakes such a symbol's first value into
    ``new_full``'s fill: a kernel compiled at one CE weight went on giving that weight's one-hot
    gradient at any other, in the process and, through inductor's on-disk cache, in later ones
    (``tests/unit/losses/test_chunk_terms.py``). Tensors are inputs of the compiled graph.
    """
    values = (objective.temperature, objective.kd_weight, objective.ce_weight)
    scales = torch.tensor(values, dtype=math_dtype(like.dtype), device=like.device)
    return scales, objective.temperature != 1.0


@functools.cache
def _compiled(terms: Callable) -> Callable:
    """``terms`` through ``torch.compile``: one fused kernel instead of a dozen passes over each
    vocab-sized chunk. Compiled once per process (≈15 s on a CPU), for any shape."""
    return torch.compile(terms, dynamic=True)


def _compiled_or_eager(
    args: tuple, terms: Callable = _fused_terms
) -> tuple[Tensor | None, Tensor, Tensor]:
    """The compiled terms, or, if compiling fails here (no C++ compiler, an unsupported
    backend), the eager ones from then on, with one warning. An error the eager terms raise
    too is the inputs' (a label outside the vocabulary): it is raised, and compiling stays on
    for the batches after it."""
    global _COMPILE_FAILED
    if _COMPILE_FAILED:
        return terms(*args)
    try:
        return _compiled(terms)(*args)
    except Exception as error:  # compile errors come in many types; eager re-raises real ones
        result = terms(*args)
        _COMPILE_FAILED = True
        warnings.warn(
            f"distill.compile: torch.compile failed ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:200]}); the chunked loss runs eagerly",
            stacklevel=2,
        )
        return result


_COMPILE_FAILED = False


def chunk_fused(
    logits: Tensor,
    teacher_logits: Tensor | TopKTeacher | None,
    targets: Tensor,
    objective: LogitObjective,
    compile: bool = False,
) -> tuple[Tensor, Tensor, Tensor, None]:
    """As :func:`chunk_autograd`, from log-sum-exps and the divergence's closed form (for a
    cached teacher's top-k records: forward KL only, see :func:`_top_k_fused_terms`).

    Logits that are not finite (−inf for masked vocabulary entries) take the autograd route,
    which handles 0 · log 0 exactly.
    """
    temperature = objective.temperature
    scales = _scales(objective, logits)
    if isinstance(teacher_logits, TopKTeacher):
        teacher_logits.check_width(logits.shape[-1])
        terms, args = _top_k_fused_terms, (logits, teacher_logits, targets, *scales)
    else:
        terms = _fused_terms
        args = (logits, teacher_logits, targets, objective.divergence.fused, *scales)
    value, ce, grad = _compiled_or_eager(args, terms) if compile else terms(*args)
    finite = bool(torch.isfinite(ce)) and (value is None or bool(torch.isfinite(value).all()))
    if not finite:
        return chunk_autograd(logits, teacher_logits, targets, objective)
    kd = torch.zeros_like(ce) if value is None else value.sum() * temperature**2
    return kd, ce, grad, None  # no span term: a cross-tokenizer teacher takes autograd's route
