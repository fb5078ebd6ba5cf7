"""A folder ``data.dataset.path`` whose files ``datasets`` gives to splits by their names: a file
no split reads is refused, a named split left unread is said (``data/folder_splits.py``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from lightning_kd.data.dataset_source import DatasetSource, open_split
from lightning_kd.data.text import TextDataModule
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused


def folder(root: Path, *names: str) -> Path:
    """A folder of one ``.jsonl`` file per name, 6 documents each naming their file."""
    root.mkdir()
    for name in names:
        rows = [{"text": f"{name} document {i} " * 8} for i in range(6)]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_a_file_no_split_reads_is_refused_with_the_builder_that_reads_them_all(
    tmp_path, datasets_home
) -> None:
    """misc.jsonl beside train_2023.jsonl was never read, without a word (probe 46)."""
    root = folder(tmp_path / "f", "train_2023", "train_2024", "misc", "dev")
    refusal = (
        r"by their names \(train: train_2023.jsonl, train_2024.jsonl; validation: dev.jsonl\) "
        r"and reads 1 file\(s\) into none: misc.jsonl; read them all with "
        rf"data.dataset.path=json 'data.dataset.data_files={root}/\*.jsonl'"
    )
    with pytest.raises(Refused, match=refusal):
        open_split(DatasetSource.of({"path": str(root)}), "train", streaming=True)
    source = {"path": "json", "data_files": f"{root}/*.jsonl"}  # the advice, followed
    data = TextDataModule(byte_tokenizer(), block_size=64, dataset=source)
    data.setup()
    text = byte_tokenizer().decode(torch.cat(data.train_examples))
    assert all(name in text for name in ("train_2023", "train_2024", "misc", "dev"))


def test_a_folder_of_a_test_file_among_others_is_refused_not_offered_its_test_split(
    tmp_path, datasets_home
) -> None:
    """Its refusal said "its splits: ['test']": followed, notes and more went unread."""
    root = folder(tmp_path / "f", "notes", "more", "test_cases")
    with pytest.raises(Refused, match=r"reads 2 file\(s\) into none: more.jsonl, notes.jsonl"):
        open_split(DatasetSource.of({"path": str(root)}), "train", streaming=True)


def test_a_folder_of_several_formats_is_refused_naming_each(tmp_path, datasets_home) -> None:
    """datasets reads a folder with its commonest format's builder: b.txt and c.csv beside
    a.jsonl went unread, without a word (probe 52). Files of one builder's (.json and .jsonl)
    are one format."""
    root = folder(tmp_path / "f", "a")
    (root / "b.txt").write_text("a document of its own " * 8)
    (root / "c.csv").write_text("text\n" + "a row " * 8 + "\n")
    refusal = r"holds files of 3 formats \(json: a.jsonl; text: b.txt; csv: c.csv\)"
    with pytest.raises(Refused, match=refusal):
        open_split(DatasetSource.of({"path": str(root)}), "train", streaming=True)
    (root / "b.txt").unlink()
    (root / "c.csv").unlink()
    (root / "d.json").write_text(json.dumps({"text": "one more " * 8}) + "\n")
    open_split(DatasetSource.of({"path": str(root)}), "train", streaming=True)


def test_a_named_validation_split_left_unread_is_said(tmp_path, datasets_home) -> None:
    root = folder(tmp_path / "named", "train_a", "dev")
    with pytest.warns(UserWarning, match=r"set data.dataset.val_split=validation to validate"):
        open_split(DatasetSource.of({"path": str(root)}), "train", streaming=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read: nothing to say
        source = {"path": str(root), "val_split": "validation"}
        open_split(DatasetSource.of(source), "train", streaming=True)
        plain = folder(tmp_path / "plain", "notes", "more")  # no names: all of it is train
        open_split(DatasetSource.of({"path": str(plain)}), "train", streaming=True)


def test_a_datasets_own_validation_split_left_unread_is_said(tmp_path, datasets_home) -> None:
    """A DatasetDict's validation split went unused, without a word, while validation was held
    out of train (probe 46)."""
    import datasets

    rows = {"text": [f"document {i} " * 8 for i in range(12)]}
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "validation": datasets.Dataset.from_dict(rows)}
    )
    splits.save_to_disk(tmp_path / "saved")
    with pytest.warns(UserWarning, match=r"has a split 'validation', which goes unread"):
        open_split(DatasetSource.of({"path": str(tmp_path / "saved")}), "train", streaming=False)
    files = {"train": str(folder(tmp_path / "f", "a") / "a.jsonl")}
    files["test"] = files["train"]  # a test split is not offered for validation
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_split(DatasetSource.of({"path": "json", "data_files": files}), "train", streaming=True)


def test_a_streamed_folder_or_split_mapping_says_its_unread_validation_once(
    tmp_path, datasets_home
) -> None:
    """Said where the splits are known before opening, and again by the stream's own splits."""
    root = folder(tmp_path / "named", "train_a", "dev")
    mapping = {"train": str(root / "train_a.jsonl"), "validation": str(root / "dev.jsonl")}
    for source in ({"path": str(root)}, {"path": "json", "data_files": mapping}):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            open_split(DatasetSource.of(source), "train", streaming=True)
        unread = [w for w in said if "which goes unread" in str(w.message)]
        assert len(unread) == 1, [str(w.message) for w in said]
