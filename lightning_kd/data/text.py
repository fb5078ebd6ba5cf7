"""Text data for distillation: read documents, tokenize with the teacher's tokenizer, batch.

Two layouts:
- ``pack=True`` (default): documents are joined with the EOS token and cut into fixed blocks of
  ``block_size`` tokens, the usual layout for language-model training; no padding at all.
- ``pack=False``: one document per example, truncated to ``block_size`` and padded per batch;
  padded positions carry label ``-100`` and attention mask 0.

The split into train and validation is by example, with a seeded permutation, so it is the same on
every machine and every rank. Training order is a seeded permutation per epoch, and a run resumed
from a mid-epoch checkpoint skips the batches that epoch already trained on, so it sees exactly the
batches the uninterrupted run would have.

Files: ``.txt`` (one document per file), ``.jsonl`` (one JSON object per line, text under
``text_field``), either optionally gzipped. Glob patterns are expanded.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from lightning_kd.data.loaders import EpochSampler, ResumableLoader
from lightning_kd.data.provenance import examples_digest, files_record
from lightning_kd.data.reading import (
    FORMATS,
    file_format,
    read_documents,
    unique_documents,
    unique_files,
)
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.utils.compat import resumed_batches_in_epoch

DEFAULT_CORPUS = Path(__file__).parent / "corpus" / "python_reference.jsonl.gz"
"""The Python 3.11 Language Reference (see ``lightning_kd/data/corpus/README.md``)."""
TEACHER_CORPUS = Path(__file__).parent / "corpus" / "smollm2_generated.jsonl.gz"
"""General English written by the default teacher itself (``data/corpus/README.md``)."""
DEFAULT_FILES = (DEFAULT_CORPUS, TEACHER_CORPUS)
"""What ``data.files: null`` reads: technical prose and the teacher's own broad English."""
EMBEDDED = {"python_reference": DEFAULT_CORPUS, "smollm2_generated": TEACHER_CORPUS}
"""Names that ``data.files`` entries may use for the embedded corpora."""

SUFFIXES = tuple(FORMATS)


def expand_files(patterns: list[str], key: str = "data.files") -> list[Path]:
    """The files named by ``patterns`` — paths, globs, or the names of the embedded corpora
    (``python_reference``, ``smollm2_generated``) — checked to exist and be readable here; the
    errors name ``key``, the setting that gave them (``--files`` for ``evaluate``)."""
    files: list[Path] = []
    for pattern in patterns:
        if pattern in EMBEDDED:
            files.append(EMBEDDED[pattern])
            continue
        matches = sorted(glob.glob(str(Path(pattern).expanduser()))) if _is_glob(pattern) else []
        if _is_glob(pattern) and not matches:
            raise FileNotFoundError(f"{key} pattern {pattern!r} matches no file")
        for name in matches or [pattern]:
            path = Path(name).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"{key} entry {name!r} is not a file")
            if file_format(path) is None:
                raise ValueError(f"{key} entry {name!r}: use one of {', '.join(SUFFIXES)}")
            files.append(path)
    return unique_files(files)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def separator_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token that ends a document: EOS for causal LMs, SEP for BERT-style encoders."""
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id


def pack_blocks(token_lists: list[list[int]], block_size: int, eos_id: int) -> Tensor:
    """Join documents with ``eos_id``; cut into ``[n_blocks, block_size]`` (tail dropped)."""
    stream = [token for tokens in token_lists for token in (*tokens, eos_id)]
    count = len(stream) // block_size
    return torch.tensor(stream[: count * block_size], dtype=torch.long).view(count, block_size)


@dataclass(frozen=True)
class Unscored:
    """An example's tokens, run through the models but scored nowhere (its labels are all -100).

    It pads the validation set to a multiple of the world size: Lightning's DistributedSampler
    would otherwise repeat real examples on some ranks, and those would count twice in every
    metric. Ranks keep equal batch counts (so no rank waits in a collective), and the padding
    adds no token to any sum.
    """

    tokens: Tensor


class IndexedBlocks(Dataset):
    """``blocks[i]`` as ``(i, block)``: each batch then says which blocks it holds
    (``block_index``, −1 for :class:`Unscored` padding), which a cached teacher's records are
    looked up by."""

    def __init__(self, blocks: list[Tensor | Unscored]) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> tuple[int, Tensor | Unscored]:
        block = self.blocks[index]
        return (-1 if isinstance(block, Unscored) else index), block


def pad_for_ranks(examples: list[Tensor], world_size: int) -> list[Tensor | Unscored]:
    """``examples`` plus unscored copies of the first few, to a multiple of ``world_size``."""
    extra = -len(examples) % world_size
    return examples + [Unscored(examples[i % len(examples)]) for i in range(extra)]


class TextDataModule(LightningDataModule):
    """Tokenized text for a teacher/student pair, packed or padded, with a fixed val split."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        files: list[str] | None = None,
        block_size: int = 256,
        batch_size: int = 2,
        val_batch_size: int | None = 8,
        val_fraction: float = 0.05,
        max_train_examples: int | None = None,
        pack: bool = True,
        text_field: str = "text",
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if block_size < 2:
            raise ValueError(f"data.block_size={block_size}; a block needs at least 2 tokens")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={val_fraction} must lie strictly between 0 and 1")
        if max_train_examples is not None and max_train_examples < 1:
            raise ValueError(
                f"data.max_train_examples={max_train_examples}; use a count ≥ 1, or null for all"
            )
        if separator_id(tokenizer) is None:
            raise ValueError("the tokenizer has no EOS or SEP token to separate packed documents")
        self.tokenizer = tokenizer
        if files is not None and not files:
            raise ValueError(
                "data.files is empty; list your files (data.files=[a.txt,'dir/*.jsonl']), or "
                "set data.files=null for the built-in corpus"
            )
        self.files = expand_files(list(files)) if files is not None else list(DEFAULT_FILES)
        self.block_size = block_size
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.val_fraction = val_fraction
        self.max_train_examples = max_train_examples
        self.pack = pack
        self.text_field = text_field
        self.seed = seed
        self.num_workers = num_workers
        self.train_examples: list[Tensor] = []
        self.val_examples: list[Tensor] = []

    def setup(self, stage: str | None = None) -> None:
        """Read, tokenize and split the corpus (once; later stages reuse it)."""
        if self.train_examples:
            return
        documents = unique_documents(
            [
                text
                for path in self.files
                for text in read_documents(path, self.text_field)
                if text.strip()
            ]
        )
        if not documents:
            raise ValueError(f"no text in {[str(p) for p in self.files]}: the files are empty")
        token_lists = self.tokenizer(documents, add_special_tokens=False)["input_ids"]
        if self.pack:
            examples = list(pack_blocks(token_lists, self.block_size, separator_id(self.tokenizer)))
        else:
            examples = [torch.tensor(t[: self.block_size]) for t in token_lists if len(t) >= 2]
        if len(examples) < 2:
            total = sum(len(t) for t in token_lists)
            raise ValueError(
                f"the corpus gives {len(examples)} example(s) of {self.block_size} tokens "
                f"({total} tokens in all); one is needed for training and one for validation: "
                "add text (data.files=[...]) or lower data.block_size"
            )
        order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(self.seed))
        val_count = min(max(1, round(self.val_fraction * len(examples))), len(examples) - 1)
        self.val_examples = [examples[i] for i in order[:val_count].tolist()]
        self.train_examples = self.limit([examples[i] for i in order[val_count:].tolist()])

    def limit(self, train: list) -> list:
        """The first ``data.max_train_examples`` of the shuffled training split (all of it when
        unset or larger): a fixed subset trained on epoch after epoch, validation unchanged."""
        return train if self.max_train_examples is None else train[: self.max_train_examples]

    def provenance(self) -> dict[str, Any]:
        """What a checkpoint records of this data, once set up (see ``data/provenance.py``): the
        settings that shape the batches, the files' digests, the examples' digest."""
        names = {path: name for name, path in EMBEDDED.items()}
        return {
            "block_size": self.block_size,
            "batch_size": self.batch_size,
            "pack": self.pack,
            "seed": self.seed,
            "val_fraction": self.val_fraction,
            "max_train_examples": self.max_train_examples,
            "text_field": self.text_field,
            "files": files_record(self.files, names),
            "examples": examples_digest([*self.train_examples, *self.val_examples]),
        }

    @property
    def train_tokens(self) -> int:
        """Tokens in the training split (one epoch)."""
        return sum(len(example) for example in self.train_examples)

    def collate(
        self, examples: list[Tensor | Unscored] | list[tuple[int, Tensor | Unscored]]
    ) -> dict[str, Tensor]:
        """Right-pad to the longest example; padding is masked from attention and labels, and
        :class:`Unscored` examples from labels. Examples given as ``(block index, tokens)``
        (:class:`IndexedBlocks`) add ``block_index`` ``[batch]`` to the batch."""
        block_index = None
        if examples and isinstance(examples[0], tuple):
            block_index = torch.tensor([index for index, _ in examples], dtype=torch.long)
            examples = [example for _, example in examples]
        unscored = [isinstance(example, Unscored) for example in examples]
        examples = [
            example.tokens if isinstance(example, Unscored) else example for example in examples
        ]
        length = max(len(example) for example in examples)
        pad_id = self.tokenizer.pad_token_id
        pad_id = separator_id(self.tokenizer) if pad_id is None else pad_id
        input_ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
        for row, example in enumerate(examples):
            input_ids[row, : len(example)] = example
            attention_mask[row, : len(example)] = 1
        labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        labels[torch.tensor(unscored)] = IGNORE_INDEX
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        return batch if block_index is None else batch | {"block_index": block_index}

    def train_dataloader(self) -> DataLoader:
        return ResumableLoader(
            IndexedBlocks(self.train_examples),
            batch_size=self.batch_size,
            sampler=EpochSampler(self.train_examples, self.seed),
            collate_fn=self.collate,
            num_workers=self.num_workers,
            skip_batches=self.batches_already_trained,
        )

    def batches_already_trained(self) -> int:
        """Batches of the current epoch a resumed run has trained on (0 unless resuming).

        Read from Lightning's own loop progress, restored from the checkpoint: the one count that
        knows what was trained, whatever the data fetcher had prefetched when it was saved.
        """
        trainer = self.trainer
        if trainer is None:
            return 0
        done = resumed_batches_in_epoch(trainer)
        return 0 if done >= trainer.num_training_batches else done

    def val_dataloader(self) -> DataLoader:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return DataLoader(
            IndexedBlocks(pad_for_ranks(self.val_examples, world_size)),
            batch_size=self.val_batch_size,
            collate_fn=self.collate,
            num_workers=self.num_workers,
        )
