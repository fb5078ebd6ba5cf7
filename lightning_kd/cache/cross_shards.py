"""A cache shard of a teacher that reads its own tokenisation of the student's blocks: its top k in
its vocabulary at the student positions aligned with one of its own, and each block's teacher NLL
and bytes (``cache/format.py``), computed by the cross-tokenizer path the run itself uses
(``distill/cross_tokenizer.py``, a layer above: reached through :class:`CrossTokenizer`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from lightning_kd.cache.format import LOG_PROB_DTYPE, TAIL_DTYPE, CacheSpec, ids_dtype
from lightning_kd.cache.shard_files import WriteStats
from lightning_kd.losses.chunked import OutputHead
from lightning_kd.losses.cross_top import TeacherSide
from lightning_kd.models.heads import output_head


class CrossTokenizer(Protocol):
    """What the writer reads of a teacher with another tokenizer than the student's
    (``distill.cross_tokenizer.CrossTokenizer``, a layer above)."""

    @property
    def teacher_tokenizer(self) -> Any: ...

    def teacher_side(
        self,
        teacher: nn.Module,
        head: OutputHead,
        batch: dict[str, Tensor],
        temperature: float,
        keep: bool = False,
        k: int | None = None,
    ) -> TeacherSide: ...


def _empty_records(blocks: list[Tensor], positions: int, k: int) -> dict[str, Tensor]:
    """A shard's tensors before any batch fills them; a span stays NaN where none ends."""
    count = len(blocks)
    return {
        "ids": torch.zeros(count, positions, k, dtype=torch.int64),
        "log_probs": torch.zeros(count, positions, k),
        "tail": torch.zeros(count, positions),
        "aligned": torch.zeros(count, positions, dtype=torch.uint8),
        "span": torch.full((count, positions), float("nan")),
        "teacher_nll": torch.zeros(count, dtype=torch.float64),
        "teacher_bytes": torch.zeros(count, dtype=torch.int64),
        "lengths": torch.tensor([len(block) for block in blocks], dtype=torch.int32),
    }


@torch.no_grad()
def cross_shard_records(
    teacher: nn.Module,
    blocks: list[Tensor],
    collate: Callable[[list[Tensor]], dict[str, Tensor]],
    spec: CacheSpec,
    block_size: int,
    device: torch.device,
    stats: WriteStats,
    cross: CrossTokenizer,
) -> dict[str, Tensor]:
    """The stored tensors of one shard's ``blocks`` for a teacher with another tokenizer: its
    top k (in its vocabulary) at the student positions aligned with its own, which those are,
    the teacher's log-probability of each span, and each block's teacher NLL and bytes
    (``cache.format``)."""
    vocab = teacher.get_output_embeddings().weight.shape[0]
    head = output_head(teacher)
    out = _empty_records(blocks, block_size - 1, spec.k)
    stats.cross = True
    for first in range(0, len(blocks), spec.batch_size):
        batch = collate(blocks[first : first + spec.batch_size])
        batch = {key: value.to(device) for key, value in batch.items()}
        started = time.perf_counter()
        side = cross.teacher_side(teacher, head, batch, spec.temperature, keep=True, k=spec.k)
        grid = side.on_grid()
        rows, length = grid.wanted.shape
        got = {
            "ids": grid.top.ids,
            "log_probs": grid.top.log_probs,
            "tail": grid.top.rest,
            "aligned": grid.wanted.to(torch.uint8),
            "span": grid.span,
        }
        for name, value in got.items():
            out[name][first : first + rows, :length] = value.cpu()
        out["teacher_nll"][first : first + rows] = grid.nll.cpu()
        out["teacher_bytes"][first : first + rows] = grid.text_bytes.cpu()
        stats.forward_seconds += time.perf_counter() - started
        stats.tokens += int(batch["attention_mask"].sum())
    out["ids"] = out["ids"].to(ids_dtype(vocab))
    out["log_probs"] = out["log_probs"].to(LOG_PROB_DTYPE)
    out["tail"] = out["tail"].to(TAIL_DTYPE)
    return out
