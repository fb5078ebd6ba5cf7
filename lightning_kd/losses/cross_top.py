"""The teacher's own top k at a student's positions, before any map of the two vocabularies: what
the cross-tokenizer path takes from the teacher's logits a chunk of positions at a time, and what a
cross-tokenizer teacher's cache stores (``cache/format.py``); ``cross_vocab.py`` turns it into
records the loss reads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.logits import math_dtype
from lightning_kd.losses.topk import target_log_prob


@dataclass(frozen=True)
class TeacherTop:
    """The teacher's own top k at some positions, in its vocabulary: what its logits leave once
    reduced, and what a cache of a cross-tokenizer teacher stores (``cache/format.py``)."""

    ids: Tensor
    """``[..., k]`` teacher ids, most probable first."""
    log_probs: Tensor
    """``[..., k]`` their log-probabilities at the temperature."""
    rest: Tensor
    """``[...]`` the log of the mass outside the top k (−inf when they hold everything)."""

    def __getitem__(self, rows) -> TeacherTop:
        return TeacherTop(self.ids[rows], self.log_probs[rows], self.rest[rows])


@torch.no_grad()
def teacher_top(
    teacher_logits_of,
    positions: Tensor,
    *,
    k: int,
    temperature: float,
    chunk: int,
    targets: Tensor | None = None,
) -> tuple[TeacherTop, Tensor]:
    """The teacher's top k at ``positions`` (``[n]`` indices into its flattened positions),
    ``chunk`` positions at a time, and the log-probability (T = 1) of each next token
    ``targets`` (``[n]`` ids, −1 where none counts: 0 there; zeros without them): one pass of the
    teacher's head serves both, and no ``[positions, teacher_vocab]`` tensor outlives a chunk.

    ``teacher_logits_of(index)`` returns the teacher's logits ``[len(index), teacher_vocab]`` of
    those flattened positions."""
    parts, target_parts = [], []
    for start in range(0, positions.numel(), chunk):
        logits = teacher_logits_of(positions[start : start + chunk])
        k_here = min(k, logits.shape[-1])
        log_p = F.log_softmax(logits.to(math_dtype(logits.dtype)) / temperature, -1)
        top, ids = log_p.topk(k_here, dim=-1)
        rest = torch.logsumexp(log_p.scatter_(-1, ids, float("-inf")), -1)
        parts.append((ids, top, rest))
        picked = torch.zeros(len(ids), dtype=torch.float64, device=ids.device)
        if targets is not None:
            wanted = targets[start : start + chunk]
            counted = wanted >= 0
            picked[counted] = target_log_prob(logits[counted].double(), wanted[counted])
        target_parts.append(picked)
    if not parts:
        device = positions.device
        empty = TeacherTop(
            torch.zeros((0, k), dtype=torch.long, device=device),
            torch.zeros((0, k), device=device),
            torch.zeros(0, device=device),
        )
        return empty, torch.zeros(0, dtype=torch.float64, device=device)
    ids, log_probs, rest = (torch.cat(column) for column in zip(*parts, strict=True))
    return TeacherTop(ids, log_probs, rest), torch.cat(target_parts)


@dataclass
class TeacherSide:
    """The teacher's own top k at the student positions ``wanted`` ``[batch, seq − 1]`` (in
    order), each row's teacher NLL (nats, T = 1) and bytes over the student's scored text
    (zeros where not measured), and the teacher's log-probability of the span from each wanted
    position to the next (``cross_spans.py``; None where not measured): what a
    cross-tokenizer teacher's cache stores."""

    top: TeacherTop
    wanted: Tensor
    nll: Tensor
    text_bytes: Tensor
    span: Tensor | None = None

    def on_grid(self) -> TeacherSide:
        """The same with ``top`` and ``span`` spread over the whole grid (zeros, NaN, where
        nothing is wanted)."""
        top = TeacherTop(
            spread(self.top.ids, self.wanted, 0),
            spread(self.top.log_probs, self.wanted, 0.0),
            spread(self.top.rest, self.wanted, 0.0),
        )
        span = None if self.span is None else spread(self.span, self.wanted, float("nan"))
        return TeacherSide(top, self.wanted, self.nll, self.text_bytes, span)


def spread(values: Tensor, wanted: Tensor, fill) -> Tensor:
    """``values`` (one row per ``wanted`` position) on ``wanted``'s grid, ``fill`` elsewhere."""
    grid = values.new_full((*wanted.shape, *values.shape[1:]), fill)
    grid[wanted] = values
    return grid
