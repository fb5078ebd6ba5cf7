"""A cached teacher in a training run: the records of each batch's blocks, in the teacher's place.

:meth:`CachedTeacher.for_run` opens the cache against the run's own key — the teacher's weights
and config, the tokenizer, every block of both splits, block size, pack, temperature — so a
cache of anything else is refused before the first step. Batches of
:class:`~lightning_kd.data.text.TextDataModule` carry each row's ``block_index`` (−1 for the
unscored padding rows of validation); :meth:`CachedTeacher.records` turns it into the
:class:`~lightning_kd.losses.topk.TopKTeacher` the loss and the validation metrics read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from lightning_kd.cache.format import cache_key
from lightning_kd.cache.reader import CacheMismatch, TeacherCache, read_index
from lightning_kd.losses.cross_top import TeacherSide, TeacherTop
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.losses.topk import TopKTeacher


class CrossRecords(Protocol):
    """What a cross-tokenizer cache's records are read through
    (``distill.cross_tokenizer.CrossTokenizer``, a layer above)."""

    top_k: int
    span_weight: float

    @property
    def teacher_tokenizer(self) -> Any: ...

    def cached_records(
        self, stored: TeacherSide, labels: Tensor, counted: Tensor | None = None
    ) -> Any: ...


class CachedTeacher:
    """The teacher's top-k records of a run's blocks, served by block index."""

    def __init__(
        self,
        cache: TeacherCache,
        vocab: int,
        cross: CrossRecords | None = None,
        blocks: dict[str, list[Tensor]] | None = None,
    ) -> None:
        self.cache = cache
        self.vocab = vocab
        """Rows of the teacher's output head: the records' ids index them."""
        self.cross = cross
        """With a teacher of another tokenizer: the path that maps its cached top k."""
        self.blocks = blocks or {}
        """Each split's token blocks the cache was written for: a batch's rows are checked
        against the blocks their ``block_index`` names."""

    @property
    def key(self):
        return self.cache.key

    @staticmethod
    def stored_dtype(directory: str | Path) -> str:
        """The teacher dtype the cache in ``directory`` was written with (its key's), so that a
        run loads the teacher as the writer did and their weights digests can agree."""
        return read_index(Path(directory))["key"]["teacher_dtype"]

    @classmethod
    def for_run(
        cls,
        directory: str | Path,
        teacher: nn.Module,
        tokenizer: Any,
        data: Any,
        temperature: float,
        features: tuple[str, ...] = (),
        cross: CrossRecords | None = None,
    ) -> CachedTeacher:
        """The cache in ``directory``, checked whole and written for this ``teacher``,
        ``tokenizer``, ``data`` (a set-up :class:`~lightning_kd.data.text.TextDataModule`) and
        ``temperature``, holding the outputs of the teacher modules ``features`` (with
        ``cross``: read by the teacher in its own tokenisation); any k (across tokenizers, at
        least ``distill.cross_top_k``)."""
        k = read_index(Path(directory))["key"]["k"]
        teacher_tokenizer = None if cross is None else cross.teacher_tokenizer
        expect = cache_key(teacher, tokenizer, data, k, temperature, features, teacher_tokenizer)
        vocab = teacher.get_output_embeddings().weight.shape[0]
        cache = TeacherCache.open(directory, expect)
        if cross is not None and k < cross.top_k:
            raise CacheMismatch(
                f"the teacher cache in {directory} holds the teacher's top {k}, this run reads "
                f"its top distill.cross_top_k={cross.top_k}: write the cache with cache.k="
                f"{cross.top_k} or more, or set distill.cross_top_k={k}"
            )
        if cross is not None and cross.span_weight > 0 and not _has_spans(cache):
            raise CacheMismatch(
                f"the teacher cache in {directory} holds no span log-probabilities (written "
                "before caches stored them), which distill.cross_span_weight="
                f"{cross.span_weight} reads: write it again (lightning-kd cache into a new "
                "directory, or delete it and let distill.teacher_cache=auto rewrite it), or set "
                "distill.cross_span_weight=0"
            )
        blocks = {"train": data.train_examples, "val": data.val_examples}
        return cls(cache, vocab, cross, blocks)

    @classmethod
    def for_distiller(
        cls,
        distill: Any,
        task: str,
        teacher: nn.Module,
        tokenizer: Any,
        data: Any,
        features: tuple[str, ...] = (),
        cross: CrossRecords | None = None,
    ) -> CachedTeacher:
        """The cache ``distill.teacher_cache`` names, refused unless written for this run
        (and holding the teacher modules ``features``; with ``cross``, across tokenizers)."""
        if task != "causal_lm":
            raise ValueError(
                f"distill.teacher_cache: teacher.task={task!r}; only causal LMs' logits are cached"
            )
        if data is None or tokenizer is None or not getattr(data, "train_examples", None):
            raise ValueError(
                "distill.teacher_cache: the cache is matched to the run's data and tokenizer; "
                "pass the set-up data module (a Trainer fit/validate with datamodule=...)"
            )
        return cls.for_run(
            distill.teacher_cache, teacher, tokenizer, data, distill.temperature, features, cross
        )

    def records(self, batch: dict[str, Tensor], split: str) -> tuple[Any, dict[str, Tensor]]:
        """The records of ``batch``'s rows (blocks of ``split``), positions 0 .. seq − 2, and the
        cached teacher module outputs (positions 0 .. seq − 1), on the batch's device. Unscored
        rows (index −1) get block 0's records: their labels are all −100, so no loss or metric
        reads them."""
        if "block_index" not in batch:
            raise ValueError(
                "distill.teacher_cache: the batch has no 'block_index' (which cached block each "
                "row is); train with lightning_kd.data.text.TextDataModule, whose batches carry it"
            )
        index = checked_index(batch["block_index"], batch["labels"])
        self.check_rows(batch["input_ids"].cpu(), index, split)
        index = index.clamp(min=0)
        records = self.cache.records(split, index)
        positions = batch["input_ids"].shape[1] - 1
        check_positions(positions, records.ids.shape[1])
        device = batch["input_ids"].device

        def take(tensor: Tensor) -> Tensor:
            return tensor[:, :positions].to(device, non_blocking=True)

        if self.cross is not None:
            stored = TeacherSide(
                TeacherTop(take(records.ids), take(records.log_probs), take(records.tail)),
                take(records.cross["aligned"]).bool(),
                records.cross["teacher_nll"].to(device),
                records.cross["teacher_bytes"].to(device),
                take(records.cross["span"]) if "span" in records.cross else None,
            )
            real = None
            if split == "val":  # blocks, not the padding rows, whose text some teacher scores
                scored = (batch["labels"] != IGNORE_INDEX).any(-1).cpu()
                real = ((batch["block_index"] >= 0) & scored).to(device)
            return self.cross.cached_records(stored, batch["labels"], real), {}

        top_k = TopKTeacher(
            take(records.ids),
            take(records.log_probs),
            take(records.tail),
            self.vocab,
            take(records.target),
        )
        features = {
            path: value[:, : positions + 1].to(device, non_blocking=True)
            for path, value in records.features.items()
        }
        return top_k, features

    def check_rows(self, ids: Tensor, index: Tensor, split: str) -> None:
        """Refuse a row whose tokens are not those of the block its index names (records are
        found by index alone: another block's would be read without a word)."""
        blocks = self.blocks.get(split)
        for row, number in enumerate(index.tolist() if blocks is not None else []):
            if number < 0:
                continue
            block = blocks[number] if number < len(blocks) else None
            length = 0 if block is None else min(len(block), ids.shape[1])
            if block is None or not torch.equal(ids[row, :length], block[:length]):
                found = "holds other tokens" if block is not None else f"has {len(blocks)} blocks"
                raise ValueError(
                    f"distill.teacher_cache: row {row} of the batch has 'block_index' {number}, "
                    f"and the cache's {split!r} split {found}: its records are found by that "
                    "index alone. Give the data module's batches with their own 'block_index': "
                    "training batches to a step, validation batches (val_dataloader) to evaluate"
                )


def checked_index(index: Any, labels: Tensor) -> Tensor:
    """A batch's ``block_index`` on the CPU: a tensor of one integer a row, and −1 (no block)
    only on a row with no scored label. Its shape and type were raw torch errors, and a scored
    row of −1 was distilled against block 0's records without a word (probe 51)."""
    rows = len(labels)
    whole = isinstance(index, Tensor) and not (index.is_floating_point() or index.is_complex())
    if not (whole and index.dtype != torch.bool and index.shape == (rows,)):
        got = f"{index.dtype} of shape {tuple(index.shape)}" if isinstance(index, Tensor) else None
        raise ValueError(
            f"distill.teacher_cache: 'block_index' must be a tensor of {rows} integers, one per "
            f"row (its block in the cache's split; -1 for a padding row); it is "
            f"{got or type(index).__name__}"
        )
    index = index.cpu()
    scored = (labels != IGNORE_INDEX).any(-1).cpu()
    if (wrong := ((index < 0) & scored).nonzero()).numel():
        row = int(wrong[0])
        raise ValueError(
            f"distill.teacher_cache: row {row} of the batch has 'block_index' {int(index[row])} "
            "(no block, as a padding row has) but scored labels, which would be compared with "
            "block 0's records; give the row its block's index, or its labels -100"
        )
    return index


def check_positions(positions: int, stored: int) -> None:
    """Refuse rows of more ``positions`` than the cache's blocks hold records for (``stored``):
    an IndexError of a mask in the loss (probe 51)."""
    if positions > stored:
        raise ValueError(
            f"distill.teacher_cache: the batch's rows have {positions + 1} positions, the "
            f"cache's blocks {stored + 1}: its records cover no position past a block; give "
            "the data module's batches as they are (no padding past the block, as a "
            "collator's pad_to_multiple_of adds)"
        )


def _has_spans(cache: TeacherCache) -> bool:
    """Whether a cross-tokenizer cache stores each span's teacher log-probability (its first
    training block tells: every shard is written alike)."""
    return "span" in cache.records("train", torch.tensor([0])).cross
