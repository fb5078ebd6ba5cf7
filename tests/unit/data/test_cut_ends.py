"""Documents cut where a teacher ran out of tokens: packed, the separator after one is no target
(``data/cut_ends.py``)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from lightning_kd.data.cut_ends import CutDocument, CutEnds, cut_separators
from lightning_kd.data.errors import DataError
from lightning_kd.data.packing import pack_blocks
from lightning_kd.data.reading import cut_texts
from lightning_kd.data.text import TextDataModule
from lightning_kd.losses import IGNORE_INDEX
from lightning_kd.models.loading import byte_tokenizer
from tests.conftest import make_datamodule

EOS = 256


def test_the_separator_after_a_cut_document_is_found_in_its_block() -> None:
    documents = [[1, 2, 3], CutDocument([4, 5]), [6], CutDocument([7, 8, 9, 10]), CutDocument([11])]
    blocks = pack_blocks(documents, 4, EOS)
    assert blocks.tolist() == [[1, 2, 3, EOS], [4, 5, EOS, 6], [EOS, 7, 8, 9], [10, EOS, 11, EOS]]
    assert cut_separators(documents, 4) == {1: [2], 3: [1, 3]}
    assert cut_separators(documents, 5) == {1: [1], 2: [3]}  # the last one is in the dropped tail


def test_a_cut_rows_separator_is_unscored_and_a_finished_rows_is_scored(tmp_path: Path) -> None:
    """The student is not taught that a document ends where the teacher's budget ran out; the
    separator after a finished (or unmarked) document stays a target."""
    rows = [{"text": f"ab {i}", "finished": i % 3 != 0} for i in range(90)]
    rows[1] = {"text": "unmarked row 1"}
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cut_texts([path]) == {row["text"] for row in rows if row.get("finished") is False}
    data = make_datamodule([path], block_size=32, batch_size=4, val_fraction=0.2)
    data.setup("fit")
    cut = {
        tuple(data.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in cut_texts([path])
    }
    seen = {"cut": 0, "finished": 0}
    for loader in (data.train_dataloader(), data.val_dataloader()):
        for batch in loader:
            pairs = zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True)
            for ids, labels in pairs:
                ends = [at for at, token in enumerate(ids) if token == EOS]
                for before, at in itertools.pairwise(ends):  # whole documents only
                    kind = "cut" if tuple(ids[before + 1 : at]) in cut else "finished"
                    seen[kind] += 1
                    assert (labels[at] == IGNORE_INDEX) == (kind == "cut"), (kind, ids, labels)
    assert seen["cut"] > 10 and seen["finished"] > 20, seen


def test_a_datasets_cut_rows_are_unscored_as_a_files_are(tmp_path: Path, datasets_home) -> None:
    """Through data.dataset, the separator after a row marked "finished": false was scored
    (probe 46): read whole, it is left out as from data.files; a packed stream refuses it."""
    rows = [{"text": f"ab {i}", "finished": i % 3 != 0} for i in range(90)]
    rows[1] = {"text": "unmarked row 1"}
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    options = {"block_size": 32, "batch_size": 4, "val_fraction": 0.2}
    source = {"path": "json", "data_files": str(path)}
    files = TextDataModule(byte_tokenizer(), files=[str(path)], **options)
    dataset = TextDataModule(byte_tokenizer(), dataset=source, **options)
    for data in (files, dataset):
        data.setup("fit")
    assert len(dataset.cut_ends) == len(files.cut_ends) > 10
    pairs = zip(files.train_dataloader(), dataset.train_dataloader(), strict=True)
    assert all(torch.equal(one["labels"], other["labels"]) for one, other in pairs)
    streamed = TextDataModule(byte_tokenizer(), dataset=source, streaming=True, val_size=4)
    with pytest.raises(DataError, match=r'row 0 is marked "finished": false .*data.pack=false'):
        streamed.setup("fit")


def test_no_cut_document_leaves_the_batch_as_it_was(corpus: Path) -> None:
    data = make_datamodule([corpus])
    data.setup("fit")
    assert len(data.cut_ends) == 0
    batch = next(iter(data.train_dataloader()))
    assert torch.equal(batch["labels"], batch["input_ids"])  # packed: every token a target
    assert CutEnds().unscored(batch) is batch
