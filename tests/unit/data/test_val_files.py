"""``data.val_files``: train on every example of ``data.files``, validate on the split a run on
the validation files holds out — the same blocks, so bits per byte compare with that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.data_checks import data_setting_errors
from lightning_kd.utils.refusal import Refused
from tests.conftest import make_datamodule


def write_texts(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return path


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_validation_is_the_split_a_run_on_the_val_files_holds_out(tmp_path, corpus) -> None:
    generated = write_texts(
        tmp_path / "gen.jsonl", [f"Teacher text number {i}. " * 5 for i in range(9)]
    )
    alone = make_datamodule([corpus])
    alone.setup()
    data = make_datamodule([generated], val_files=[str(corpus)])
    data.setup()
    assert same(data.val_examples, alone.val_examples)
    whole = make_datamodule([generated], val_fraction=0.5)  # its blocks, split in two
    whole.setup()
    every = sorted(tuple(e.tolist()) for e in whole.train_examples + whole.val_examples)
    assert sorted(tuple(e.tolist()) for e in data.train_examples) == every
    assert data.provenance()["val_files"] == alone.provenance()["files"]  # a checkpoint tells


def test_a_training_document_in_the_val_files_is_left_out(tmp_path, corpus) -> None:
    shared = corpus.read_text()
    generated = write_texts(tmp_path / "gen.jsonl", [shared, "Other text. " * 30])
    with pytest.warns(UserWarning, match=r"left 1 document\(s\) of data.files out of training"):
        data = make_datamodule([generated], val_files=[str(corpus)])
        data.setup()
    trained = b"".join(bytes(e.tolist()) for e in data.train_examples)
    assert b"quick brown fox" not in trained


def test_a_training_document_differing_in_whitespace_only_is_left_out(tmp_path, corpus) -> None:
    """A .txt file's text ends in the newline its .jsonl row lacks: it stayed in training
    (probe 46)."""
    text = tmp_path / "held.txt"
    text.write_text(corpus.read_text().strip() + "\n")
    generated = write_texts(tmp_path / "gen.jsonl", [corpus.read_text().strip(), "Other. " * 30])
    with pytest.warns(UserWarning, match=r"left 1 document\(s\) .* \(whitespace aside\)"):
        data = make_datamodule([generated], val_files=[str(text)])
        data.setup()
    trained = b"".join(bytes(e.tolist()) for e in data.train_examples)
    assert b"quick brown fox" not in trained


def test_val_files_settings_that_cannot_be_are_refused(tmp_path, corpus) -> None:
    copy = tmp_path / "copy.txt"
    copy.write_text(corpus.read_text())
    with pytest.raises(Refused, match=r"data.val_files names .*copy.txt, which data.files names"):
        make_datamodule([corpus], val_files=[str(copy)])  # the same text under another name
    with pytest.raises(Refused, match=r"data.val_files is empty"):
        make_datamodule([corpus], val_files=[])
    with pytest.raises(FileNotFoundError, match=r"data.val_files entry 'none.txt' does not exist"):
        make_datamodule([corpus], val_files=["none.txt"])
    chats = write_texts(tmp_path / "c.jsonl", [])
    with pytest.raises(Refused, match=r"data.val_files=\['x'\] with data=chat"):
        ChatDataModule(make_datamodule([corpus]).tokenizer, files=[str(chats)], val_files=["x"])
    dataset = compose_config(["data.dataset.path=json", "data.val_files=[python_reference]"])
    assert any("with data.dataset" in error for error in data_setting_errors(dataset))


def test_too_few_examples_name_the_text_that_gave_them(tmp_path) -> None:
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    val.write_text("tiny\n")
    data = make_datamodule([train], val_files=[str(val)])
    with pytest.raises(ValueError, match=r"too few examples from data.val_files: 0 \(of up to 32"):
        data.setup("fit")
    with pytest.raises(ValueError, match=r"from the corpus: 0 \(of up to 32 .*one to validate\)"):
        make_datamodule([val]).setup("fit")


def test_rows_continuing_documents_this_split_holds_out_are_refused(tmp_path) -> None:
    """``generate`` continues only documents its split leaves untouched; trained on under another
    split (here another data.split_seed), some of them are validation text. Under the split they
    were written for, they train."""
    documents = write_texts(
        tmp_path / "docs.jsonl",
        [f"Document {i} says something of its own. " * 3 for i in range(40)],
    )
    writer = make_datamodule([documents])
    continued = writer.training_documents()  # generate.prompts=train_split's documents
    rows = [{"text": text[:30] + " and more.", "prompt_line": place} for place, text in continued]
    out = tmp_path / "completions.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    same_split = make_datamodule([out], val_files=[str(documents)])
    same_split.setup()  # the documents it continues are all untouched: trained on
    assert len(same_split.train_examples) > 0
    resplit = make_datamodule([out], val_files=[str(documents)], split_seed=5)
    with pytest.raises(Refused, match=r"document\(s\) the rows of data\.files continue are held"):
        resplit.setup()


def test_too_few_generated_rows_are_told_to_generate_more(tmp_path) -> None:
    """Too few rows of generate's continuations were told to lower data.block_size, which then
    held out other documents, refused in turn (probe 36)."""
    documents = write_texts(
        tmp_path / "docs.jsonl",
        [f"Document {i} says something of its own. " * 3 for i in range(40)],
    )
    place, text = make_datamodule([documents]).training_documents()[0]
    out = tmp_path / "completions.jsonl"
    out.write_text(json.dumps({"text": text[:8], "prompt_line": place}) + "\n")
    data = make_datamodule([out], val_files=[str(documents)], block_size=256)
    with pytest.raises(Refused, match=r"from the rows of data.files.*; generate more"):
        data.setup()


def test_the_training_documents_with_val_files_are_refused_with_the_way_on(tmp_path) -> None:
    """It said to name the documents in data.files, to a user who had (probe 27)."""
    documents = write_texts(tmp_path / "docs.jsonl", ["One document of its own. " * 3] * 2)
    other = write_texts(tmp_path / "val.jsonl", ["Held-out text, elsewhere. " * 3])
    data = make_datamodule([documents], val_files=[str(other)])
    with pytest.raises(Refused, match=r"told apart only without data.val_files: drop data.val"):
        data.training_documents()
