"""Text data for distillation: read documents, tokenize with the teacher's tokenizer, batch.

The documents: ``data.files`` (``.txt``, ``.jsonl``, gzipped or not; null: the embedded corpus),
or ``data.dataset`` (``dataset_source.py``), tokenized once and cached, or streamed row by row.

Two layouts (``packing.blocks_of``): ``pack=True`` (default) joins documents with the EOS token and
cuts fixed blocks of ``block_size`` tokens, no padding (the EOS after a ``"finished": false`` row
is no target: ``cut_ends.py``); ``pack=False`` truncates each document, padded per batch.

Read whole, the train/validation split is a permutation of the examples seeded by
``data.split_seed`` (or a ``data.dataset.val_split``, or ``data.val_files``: ``held_out.py``), the
same on every rank whatever ``seed`` a run sweeps; training order, a permutation per epoch seeded
by ``data.seed``; a run resumed mid-epoch skips the batches that epoch already trained on.
Streamed, validation is held out of the stream's start and a resumed run continues from the stream
position saved in its checkpoint: either way it sees the batches the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.batches import IndexedBlocks, collate_tokens, pad_for_ranks
from lightning_kd.data.cut_ends import CutEnds, marked, marked_rows
from lightning_kd.data.dataset_columns import Columns, open_checked
from lightning_kd.data.dataset_source import DatasetSource, setting_errors
from lightning_kd.data.domain_packing import DomainBlock, unzipped
from lightning_kd.data.domains import Labelled, domain_groups, file_label, labelled_rows
from lightning_kd.data.encoding import text_ids
from lightning_kd.data.epochs import check_epoch
from lightning_kd.data.errors import DataError
from lightning_kd.data.held_out import (
    check_sizes,
    checked_val_files,
    documents_errors,
    leaked_prompt_errors,
    outside,
    seeded_order,
    split_order,
    untouched_of,
    without_validation_text,
)
from lightning_kd.data.loaders import ResumableLoader, already_trained, ranks, training_order
from lightning_kd.data.packing import CORPUS, TRAIN_SPLIT, VAL, blocks_of, training_source
from lightning_kd.data.provenance import text_record
from lightning_kd.data.reading import DEFAULT_FILES, distinct_documents, expand_files
from lightning_kd.data.streaming import Layout, Stream
from lightning_kd.data.token_bytes import separator_id
from lightning_kd.data.tokenized import split_documents, streamed_tokens, text_key
from lightning_kd.utils.refusal import refuse


class TextDataModule(LightningDataModule):
    """Tokenized text for a teacher/student pair, packed or padded, with a fixed val split."""

    train_domains: list[int] | None = None
    """With ``data.domains``: each training block's domain (``domains.py``), set up; else None."""
    val_domains: list[int] | None = None
    SIZE_FIX = "lower data.block_size"  # what gives a stream more examples (Layout.size_fix)

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        files: list[str] | None = None,
        val_files: list[str] | None = None,
        block_size: int = 256,
        batch_size: int = 2,
        val_batch_size: int | None = 8,
        val_fraction: float = 0.05,
        max_train_examples: int | None = None,
        pack: bool = True,
        text_field: str = "text",
        dataset: DatasetSource | Mapping[str, Any] | None = DatasetSource(),
        streaming: bool = False,
        val_size: int = 64,
        shuffle_buffer: int = 1024,
        seed: int = 0,
        split_seed: int = 0,
        num_workers: int = 0,
        domains: Mapping[str, list[str]] | None = None,
        domain_field: str | None = None,
    ) -> None:
        super().__init__()
        check_sizes(block_size, val_fraction, max_train_examples)
        if separator_id(tokenizer) is None:
            raise DataError("the tokenizer has no EOS or SEP token to separate packed documents")
        self.tokenizer = tokenizer
        self.dataset = DatasetSource.of(dataset)
        self.streaming, self.val_size, self.shuffle_buffer = streaming, val_size, shuffle_buffer
        refuse(setting_errors(self.dataset, files, streaming, max_train_examples, num_workers))
        self.files = [] if self.dataset.given else list(DEFAULT_FILES)
        self.files = expand_files(files) if files is not None else self.files
        self.val_files = checked_val_files(val_files, self.files, self.dataset, streaming)
        self.block_size, self.batch_size = block_size, batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.val_fraction, self.max_train_examples = val_fraction, max_train_examples
        self.pack, self.text_field = pack, text_field
        self.seed, self.split_seed, self.num_workers = seed, split_seed, num_workers
        self.train_examples: list[Tensor] = []
        self.val_examples: list[Tensor] = []
        self.cut_ends = CutEnds()
        self.domain_field = domain_field
        self.domains = domain_groups(
            domains, self.files, self.dataset, streaming, self.val_files, domain_field
        )
        self.stream: Stream | None = self.streamed() if streaming else None

    def streamed(self) -> Stream:
        """``data.dataset`` read row by row (the row encoding and kept examples: a subclass's)."""
        settings = {"block_size": self.block_size, "pack": self.pack, "seed": self.seed}
        settings |= {"keep": self.keep, "by_domain": self.domains is not None}
        layout = Layout.of(self.shuffle_buffer, self.batch_size, size_fix=self.SIZE_FIX, **settings)
        return Stream(self.dataset, self.stream_row, layout, self.val_size)

    @classmethod
    def dataset_columns(cls, settings: Mapping[str, Any]) -> Columns:
        """The columns of ``data.dataset`` that ``settings`` (the ``data`` config) read."""
        text = settings.get("text_field", "text")
        if (column := settings.get("domain_field")) is None:
            return Columns(((text,),), "data.text_field")
        return Columns(((text, column),), "data.text_field and data.domain_field")

    def columns(self) -> Columns:
        """The columns this module reads of ``data.dataset``."""
        settings = {"text_field": self.text_field, "domain_field": self.domain_field}
        return self.dataset_columns(settings)

    def setup(self, stage: str | None = None) -> None:
        """Read, tokenize and split the corpus once; check an epoch's batches (``epochs.py``)."""
        if not self.val_examples:
            self.read_splits()
        check_epoch(self)

    def read_splits(self) -> None:
        """The training and validation examples (streamed: the validation examples only)."""
        if self.stream is not None:
            examples = self.stream.validation(self.columns(), *ranks(self.trainer))
            self.val_examples, self.val_domains = unzipped(examples)
            return
        if self.dataset.val_split is not None:
            val = dict(self.split_documents(self.dataset.val_split))
            train = outside(self.split_documents(self.dataset.split), val, self.dataset)
            what = f"data.dataset's validation split ({self.dataset.val_split})"
            val_examples = self.tagged(list(val.values()), every_domain=False, what=what)
            train_examples = self.tagged(train, needed=1, what=TRAIN_SPLIT)
            self.keep_split(val_examples, range(len(val_examples[0])), train_examples)
            return
        if self.val_files is not None:
            self.split_val_files()
            return
        examples = self.tagged(self.documents())
        held, kept = split_order(len(examples[0]), self.val_fraction, self.split_seed)
        self.keep_split(examples, held, examples, kept)

    def split_val_files(self) -> None:
        """Validation: the split of ``data.val_files``' blocks; training: every block of
        ``data.files`` but the documents ``data.val_files`` holds too, shuffled."""
        val = distinct_documents(self.val_files, self.text_field)
        train = distinct_documents(self.files, self.text_field)
        kept = set(without_validation_text([t for _, t in train], [t for _, t in val]))
        val_examples = self.tagged(labelled := self.read(val), every_domain=False, what=VAL)
        source = training_source(self.files)  # what gave too few, and its fix
        train_examples = self.tagged(self.read([d for d in train if d[1] in kept]), 1, source)
        held, _ = split_order(len(val_examples[0]), self.val_fraction, self.split_seed)
        untouched = partial(untouched_of, self, val, labelled)  # what generate may continue
        refuse(leaked_prompt_errors(self.files, {place for place, _ in val}, untouched))
        self.keep_split(val_examples, held, train_examples)

    def tagged(self, documents: list[Labelled], needed=None, what=CORPUS, every_domain=True):
        """``documents``' (``what``) examples, and each one's domain with ``data.domains`` (each
        domain's made apart; ``every_domain``: each must give one) or None."""
        needed = 1 + (self.dataset.val_split is None) if needed is None else needed
        if self.domains is None:
            return self.examples([tokens for _, tokens in documents], needed, what), None
        blocks_of = partial(self.examples, needed=int(every_domain))
        return self.domains.examples(documents, blocks_of, every_domain, needed)

    def keep_split(self, val: tuple, held: Sequence[int], train: tuple, kept=None) -> None:
        """Validate on ``val``'s examples (and domains) at ``held``, train on ``train``'s at
        ``kept`` (None: all, in the seeded order)."""
        kept = self.shuffled(list(range(len(train[0])))) if kept is None else kept
        self.val_examples = [val[0][i] for i in held]
        self.train_examples = self.limit([train[0][i] for i in kept])
        if val[1] is not None:
            self.val_domains = [val[1][i] for i in held]
            self.train_domains = self.limit([train[1][i] for i in kept])

    def documents(self) -> list[Labelled]:
        """Every document, labelled: of ``data.files``, or of ``data.dataset``'s split."""
        if self.dataset.given:
            return [document for _, document in self.split_documents(self.dataset.split)]
        return self.read(distinct_documents(self.files, self.text_field))

    def read(self, documents: list[tuple[str, str]]) -> list[Labelled]:
        """``(file:line, text)`` documents tokenized, each labelled with its file; a row marked
        ``"finished": false`` as a ``CutDocument`` (``cut_ends.py``)."""
        texts = [text for _, text in documents]
        files = [*self.files, *(self.val_files or [])]
        tokens = marked(texts, text_ids(self.tokenizer, texts), files, self.text_field)
        return [(file_label(place), ids) for (place, _), ids in zip(documents, tokens, strict=True)]

    def training_documents(self) -> list[tuple[str, str]]:
        """``(file:line, text)`` of each document of ``data.files`` no validation example holds a
        token of, in reading order: text a run with these settings may train on whole, whoever
        continues it (``held_out.untouched_documents``)."""
        refuse(documents_errors(self.dataset, self.val_files))
        documents = distinct_documents(self.files, self.text_field)
        return untouched_of(self, documents, self.read(documents))

    def split_documents(self, split: str) -> list[tuple[str, Labelled]]:
        """A split of ``data.dataset``: each distinct document's key, and its tokens (cached)
        labelled with its ``data.domain_field`` value (with that setting)."""
        dataset = open_checked(self.dataset, split, False, self.columns())
        where = self.dataset.describe(split)
        found = split_documents(dataset, self.tokenizer, self.text_field, where, self.dataset)
        found = marked_rows(found, dataset, self.text_field)  # "finished": false, as in files
        return labelled_rows(found, dataset, self.domains, self.text_field, where)

    def examples(self, token_lists: list, needed: int | None = None, what=CORPUS) -> list:
        """Packed blocks, or each document truncated; refused where ``what`` gives fewer than
        ``needed`` (default: one a split; one to train where validation is a split of its own)."""
        needed = 1 + (self.dataset.val_split is None) if needed is None else needed
        eos_id = separator_id(self.tokenizer)
        blocks = blocks_of(token_lists, self.block_size, self.pack, eos_id, needed, what)
        if self.pack:  # the separators after cut documents: no target (``cut_ends.py``)
            self.cut_ends.add(token_lists, blocks, self.block_size)
        return blocks

    def shuffled(self, items: list) -> list:
        """``items`` in the order ``data.split_seed`` draws (the same on every machine)."""
        return seeded_order(items, self.split_seed)

    def limit(self, train: list) -> list:
        """The first ``data.max_train_examples`` of the shuffled training split (all of it when
        unset or larger): a fixed subset trained on epoch after epoch, validation unchanged."""
        return train if self.max_train_examples is None else train[: self.max_train_examples]

    def stream_row(self, row: dict, where: str) -> tuple[str, Tensor | DomainBlock | None]:
        """A streamed row's key (its text's digest) and tokens (None: left out, as blank), with
        ``data.domains`` as a ``DomainBlock`` of its ``data.domain_field`` value's domain."""
        text, piece = streamed_tokens(self.tokenizer, row, self.text_field, self.pack, where)
        if piece is None or self.domains is None:
            return text_key(text), piece
        return text_key(text), DomainBlock(piece, self.domains.of_row(row, where))

    def keep(self, example: Any) -> bool:
        """Whether a streamed example is trained or validated on (chat: one with an answer)."""
        return True

    def provenance(self) -> dict[str, Any]:
        """What a checkpoint records of this data, once set up (``data/provenance.py``)."""
        return text_record(self)

    def collate(self, examples: list) -> dict[str, Tensor]:
        """Right-pad to the longest example (``batches.collate_tokens``)."""
        pad_id = self.tokenizer.pad_token_id
        batch = collate_tokens(examples, separator_id(self.tokenizer) if pad_id is None else pad_id)
        return self.cut_ends.unscored(batch)

    def train_dataloader(self) -> DataLoader:
        if self.stream is not None:
            return self.stream.loader(self.collate, *ranks(self.trainer))
        rank, world_size = ranks(self.trainer)
        blocks = IndexedBlocks(pad_for_ranks(self.train_examples, world_size), self.train_domains)
        return ResumableLoader(
            blocks,
            batch_size=self.batch_size,
            sampler=training_order(blocks, len(self.train_examples), self.seed, rank, world_size),
            collate_fn=self.collate,
            num_workers=self.num_workers,
            skip_batches=partial(already_trained, self.trainer),  # a resumed epoch's
        )

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A streamed batch's position is taken as it goes to training (``Stream.taken``)."""
        return self.stream.taken(batch) if self.stream is not None else batch

    def state_dict(self) -> dict[str, Any]:
        """Streamed: every rank's stream position (a collective, as a checkpoint save is)."""
        return self.stream.state_dict() if self.stream is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.stream is not None and "stream_cursors" in state_dict:
            self.stream.load_state_dict(state_dict, *ranks(self.trainer))

    def val_dataloader(self) -> DataLoader:
        return ResumableLoader(  # nothing to skip: its workers' signals alone
            IndexedBlocks(
                pad_for_ranks(self.val_examples, ranks(self.trainer)[1]), self.val_domains
            ),
            batch_size=self.val_batch_size,
            collate_fn=self.collate,
            num_workers=self.num_workers,
        )
