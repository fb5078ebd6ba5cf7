"""Span-level likelihood matching across tokenizers: a term of the cross-tokenizer loss that needs
no token of one vocabulary to match a token of the other.

Between two consecutive aligned positions ``a < b`` of a row (``data/alignment.py``: at each, both
models have read the same text), both tokenisations spell the same piece of text, in one or several
tokens on each side. Each model's probability of that piece is the product of its next-token
probabilities over its own tokens: the student's ``Σ_{a ≤ p < b} log q(x_{p+1})``, the teacher's
the same over its positions ``partner[a] .. partner[b] − 1``. Where the per-position terms
(``cross_vocab.py``) compare only the tokens spelt alike in both vocabularies and leave the rest to
ULD, which ignores which token is which, a span carries the teacher's judgement of text whatever
the two vocabularies cut it into — approximate likelihood matching (Minixhofer et al. 2025, ALM).

The two probabilities are compared as two Bernoulli distributions (this text next, or not), the
binarised forward KL ALM uses: ``p (log p − log q) + (1 − p) (log(1 − p) − log(1 − q))``, summed
over the spans, weighted ``distill.cross_span_weight`` and added to the run's KD sum.

A span counts only when every student position and every teacher position inside it predicts
scored text: across a document's end, where the teacher reads a BOS the student does not, the two
sums would not be of the same text. The chunked loss cuts its chunks between spans
(:func:`chunk_bounds`), so each chunk holds whole spans.
"""

from __future__ import annotations

from bisect import bisect_right

import torch
import torch.nn.functional as F
from torch import Tensor

LOG_HALF = -0.6931471805599453
CERTAIN = -1.0e-6
"""The largest log-probability compared: log(1 − p) of p = 1 is −inf, and a model can round a
span's probability to exactly 1."""


def teacher_spans(
    partner: Tensor, wanted: Tensor, teacher_log_probs: Tensor, teacher_scored: Tensor
) -> Tensor:
    """``[n]``, one per ``wanted`` position in row-major order: the teacher's log-probability of the
    text from it to the next wanted position of its row; NaN where the row has none, or a teacher
    position in between does not predict scored text.

    ``partner``/``wanted``: ``[batch, seq − 1]`` (the student positions' teacher partners, and the
    aligned scored ones); ``teacher_log_probs``: ``[batch, teacher_seq]`` each teacher position's
    log-probability of its next token (any value where ``teacher_scored`` is False)."""
    rows, columns = wanted.nonzero(as_tuple=True)
    values = torch.full((rows.numel(),), float("nan"), dtype=torch.float64, device=wanted.device)
    if rows.numel() < 2:
        return values
    starts = partner[rows, columns]
    summed = F.pad(teacher_log_probs.double().masked_fill(~teacher_scored, 0.0).cumsum(1), (1, 0))
    unscored = F.pad((~teacher_scored).long().cumsum(1), (1, 0))
    row, first, last = rows[:-1], starts[:-1], starts[1:]
    closed = (rows[1:] == row) & (last > first)
    last = torch.where(closed, last, first)  # another row's index is out of this one's range
    clean = unscored[row, last] == unscored[row, first]
    values[:-1] = torch.where(closed & clean, summed[row, last] - summed[row, first], values[:-1])
    return values


def teacher_spans_at(
    partner: Tensor, wanted: Tensor, scored: Tensor, index: Tensor, log_probs: Tensor
) -> Tensor:
    """:func:`teacher_spans` from the teacher's next-token ``log_probs`` at the flat positions
    ``index`` of its grid, whose ``scored`` (``[batch, teacher_seq]``) marks the positions
    that predict scored text (the last never does)."""
    scored = scored.clone()
    scored[:, -1] = False
    scored = scored.to(index.device)
    grid = torch.zeros(scored.numel(), dtype=torch.float64, device=index.device)
    grid[index] = log_probs.double()
    return teacher_spans(partner, wanted, grid.view_as(scored), scored)


def span_grid(wanted: Tensor, scored: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    """Each student position's span and the teacher's log-probability of it, on the grid
    ``[batch, seq − 1]``: the span's id (the flat index of its first position; −1 outside every
    span) and ``values`` (:func:`teacher_spans`) at every position of it (0 outside).

    A span runs from a ``wanted`` position to the next one of its row; it counts when the
    teacher's value is finite and every student position in it is ``scored``."""
    flat = wanted.reshape(-1)
    starts = flat.nonzero().squeeze(-1)
    count = starts.numel()
    span = torch.full_like(flat, -1, dtype=torch.long)
    teacher = torch.zeros(flat.shape, dtype=torch.float64, device=flat.device)
    if count < 2:
        return span.view_as(wanted), teacher.view_as(wanted)
    width = wanted.shape[1]
    unscored = F.pad((~scored).reshape(-1).long().cumsum(0), (1, 0))
    following = starts[1:]
    counts = torch.zeros(count, dtype=torch.bool, device=flat.device)
    counts[:-1] = (following // width == starts[:-1] // width) & (
        unscored[following] == unscored[starts[:-1]]
    )
    counts &= torch.isfinite(values.to(flat.device))
    latest = flat.long().cumsum(0) - 1  # the last start at or before each position
    member = (latest >= 0) & counts[latest.clamp(min=0)]
    at = latest.clamp(min=0)
    span = torch.where(member, starts[at], span)
    teacher = torch.where(member, values.to(flat.device).nan_to_num(0.0)[at], teacher)
    return span.view_as(wanted), teacher.view_as(wanted)


def span_divergence(student_log_probs: Tensor, span: Tensor, teacher: Tensor) -> Tensor:
    """Σ over the spans of the binarised forward KL between the teacher's probability of each
    span and the student's: ``student_log_probs`` ``[n]`` the student's log-probability of each
    position's next token, ``span``/``teacher`` ``[n]`` (:func:`span_grid`'s, selected alike);
    every span whole."""
    member = span >= 0
    if not bool(member.any()):
        return student_log_probs.sum() * 0.0
    ids, local = torch.unique(span[member], return_inverse=True)
    dtype = student_log_probs.dtype
    student = student_log_probs.new_zeros(len(ids)).index_add(0, local, student_log_probs[member])
    teacher_span = teacher.new_zeros(len(ids)).scatter(0, local, teacher[member]).to(dtype)
    return binary_kl(teacher_span, student).sum()


def binary_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``KL(Bernoulli(p) ‖ Bernoulli(q))`` from log-probabilities, elementwise."""
    log_p, log_q = log_p.clamp(max=CERTAIN), log_q.clamp(max=CERTAIN)
    p = log_p.exp()
    return p * (log_p - log_q) + (1.0 - p) * (log1mexp(log_p) - log1mexp(log_q))


def log1mexp(x: Tensor) -> Tensor:
    """``log(1 − e^x)`` for ``x < 0``, accurate at both ends (Mächler 2012). Each branch sees
    only inputs it is finite on, so neither puts a NaN into the other's gradient."""
    near = torch.log(-torch.expm1(x.clamp(min=LOG_HALF)))
    far = torch.log1p(-torch.exp(x.clamp(max=LOG_HALF)))
    return torch.where(x > LOG_HALF, near, far)


def chunk_bounds(total: int, size: int, span: Tensor | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` chunks of ``total`` positions, about ``size`` each, never cutting a span
    (``span``: each position's id, −1 outside; a span longer than ``size`` makes a longer
    chunk); none when ``total`` is 0."""
    cuts = [*range(0, total, size), total]
    if span is not None and bool((span >= 0).any()):
        inside = (span[1:] >= 0) & (span[1:] == span[:-1])
        allowed = torch.ones(total + 1, dtype=torch.bool)
        allowed[1:total][inside.cpu()] = False
        cuts = allowed.nonzero().squeeze(-1).tolist()
    bounds, start = [], 0
    while start < total:
        stop = cuts[bisect_right(cuts, start + size) - 1]
        if stop <= start:  # a span longer than a chunk: up to its end
            stop = cuts[bisect_right(cuts, start)]
        bounds.append((start, stop))
        start = stop
    return bounds
