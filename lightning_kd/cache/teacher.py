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
from typing import Any

from torch import Tensor, nn

from lightning_kd.cache.format import cache_key
from lightning_kd.cache.reader import TeacherCache, read_index
from lightning_kd.losses.topk import TopKTeacher


class CachedTeacher:
    """The teacher's top-k records of a run's blocks, served by block index."""

    def __init__(self, cache: TeacherCache, vocab: int) -> None:
        self.cache = cache
        self.vocab = vocab
        """Rows of the teacher's output head: the records' ids index them."""

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
    ) -> CachedTeacher:
        """The cache in ``directory``, checked whole and written for this ``teacher``,
        ``tokenizer``, ``data`` (a set-up :class:`~lightning_kd.data.text.TextDataModule`) and
        ``temperature``, holding the outputs of the teacher modules ``features``; any k."""
        k = read_index(Path(directory))["key"]["k"]
        expect = cache_key(teacher, tokenizer, data, k, temperature, features)
        vocab = teacher.get_output_embeddings().weight.shape[0]
        return cls(TeacherCache.open(directory, expect), vocab)

    @classmethod
    def for_distiller(
        cls,
        distill: Any,
        task: str,
        teacher: nn.Module,
        tokenizer: Any,
        data: Any,
        features: tuple[str, ...] = (),
    ) -> CachedTeacher:
        """The cache ``distill.teacher_cache`` names, refused unless written for this run
        (and holding the teacher modules ``features``)."""
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
            distill.teacher_cache, teacher, tokenizer, data, distill.temperature, features
        )

    def records(
        self, batch: dict[str, Tensor], split: str
    ) -> tuple[TopKTeacher, dict[str, Tensor]]:
        """The records of ``batch``'s rows (blocks of ``split``), positions 0 .. seq − 2, and the
        cached teacher module outputs (positions 0 .. seq − 1), on the batch's device. Unscored
        rows (index −1) get block 0's records: their labels are all −100, so no loss or metric
        reads them."""
        if "block_index" not in batch:
            raise ValueError(
                "distill.teacher_cache: the batch has no 'block_index' (which cached block each "
                "row is); train with lightning_kd.data.text.TextDataModule, whose batches carry it"
            )
        index = batch["block_index"].cpu().clamp(min=0)
        records = self.cache.records(split, index)
        positions = batch["input_ids"].shape[1] - 1
        device = batch["input_ids"].device

        def take(tensor: Tensor) -> Tensor:
            return tensor[:, :positions].to(device, non_blocking=True)

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
