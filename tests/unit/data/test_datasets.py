"""``data.dataset``: what ``datasets`` opens gives the batches ``data.files`` gives, tokenized once
and reused; every bad input is refused naming the dataset, split, column or row and the fix."""

from __future__ import annotations

import csv
import errno
import gzip
import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch import Callback

from lightning_kd.data.chat import ChatDataModule
from lightning_kd.data.dataset_hints import open_hint
from lightning_kd.data.dataset_source import DatasetSource, open_split
from lightning_kd.data.provenance import data_differences
from lightning_kd.data.reading import DEFAULT_FILES, read_documents
from lightning_kd.data.text import TextDataModule
from lightning_kd.data.tokenized import DIRECTORY, streamed_tokens
from lightning_kd.models.loading import byte_tokenizer
from lightning_kd.utils.refusal import Refused
from tests.conftest import make_module, make_trainer
from tests.unit.data.test_chat import TURNS, chat_tokenizer, conversations, write_rows


def write_parquet(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    """``rows`` as a parquet table with every key any row has (a row without one: null)."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    schema = schema or pa.Table.from_pydict({k: [row.get(k) for row in rows] for k in keys}).schema
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=50)
    return path


def embedded_rows() -> list[dict]:
    """The embedded corpus (both files, in order) as rows of a table."""
    return [{"text": text} for path in DEFAULT_FILES for text in read_documents(path)]


def same(first: list, second: list) -> bool:
    tensors = lambda examples: [getattr(e, "tokens", e) for e in examples]  # noqa: E731
    return len(first) == len(second) and all(
        torch.equal(a, b) for a, b in zip(tensors(first), tensors(second), strict=True)
    )


def epoch_batches(data: TextDataModule, epoch: int) -> list[dict]:
    loader = data.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_the_embedded_corpus_as_parquet_gives_the_files_batches(tmp_path, datasets_home) -> None:
    """The default run's data (its layout: 256-token blocks, 2 a batch, 180 training blocks),
    read as parquet through datasets: the same split, and the same batch at every step."""
    parquet = write_parquet(tmp_path / "corpus.parquet", embedded_rows())
    files = TextDataModule(byte_tokenizer(), max_train_examples=180)
    source = {"path": "parquet", "data_files": str(parquet)}
    dataset = TextDataModule(byte_tokenizer(), max_train_examples=180, dataset=source)
    files.setup("fit")  # the shipped corpus's own repeat: said in its README, not warned
    with pytest.warns(UserWarning, match="removed 1 duplicate document"):
        dataset.setup("fit")
    assert same(files.train_examples, dataset.train_examples)
    assert same(files.val_examples, dataset.val_examples)
    for epoch in (0, 1):
        for one, other in zip(
            epoch_batches(files, epoch), epoch_batches(dataset, epoch), strict=True
        ):
            assert all(torch.equal(one[key], other[key]) for key in one)
    assert files.provenance()["examples"] == dataset.provenance()["examples"]
    assert dataset.provenance()["dataset"]["data_files"] == {str(parquet): dataset_digest(parquet)}


def dataset_digest(path: Path) -> str:
    from lightning_kd.utils.files import file_digest

    return file_digest(path)[:20]


def test_a_short_run_from_parquet_has_the_jsonl_runs_losses(
    tmp_path, tiny_teacher, datasets_home, one_thread
):
    """fp32, the same steps from the same blocks: the same loss at every step."""
    rows = embedded_rows()[:40]
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parquet = write_parquet(tmp_path / "corpus.parquet", rows)
    losses = []
    for data in (
        TextDataModule(byte_tokenizer(), files=[str(jsonl)], block_size=32, batch_size=4),
        TextDataModule(
            byte_tokenizer(),
            block_size=32,
            batch_size=4,
            dataset={"path": "parquet", "data_files": str(parquet)},
        ),
    ):
        torch.manual_seed(0)
        record = Losses()
        trainer = make_trainer(max_steps=4, precision="32-true", callbacks=[record])
        trainer.fit(make_module(tiny_teacher), data)
        losses.append(record.losses)
    assert len(losses[0]) == 4 and losses[0] == losses[1]


class Losses(Callback):
    """Each training step's loss, as the step returned it."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"] if isinstance(outputs, dict) else outputs))


def test_tokenization_is_cached_and_keyed_by_the_data_and_the_tokenizer(
    tmp_path, datasets_home
) -> None:
    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:20])
    cache = Path(datasets_home["LIGHTNING_KD_CACHE"]) / DIRECTORY
    source = {"path": "parquet", "data_files": str(parquet)}

    def read(tokenizer=None, **settings) -> TextDataModule:
        data = TextDataModule(tokenizer or byte_tokenizer(), dataset=source, **settings)
        data.setup()
        return data

    first = read(block_size=64)
    (written,) = cache.glob("*.arrow")
    stamp = written.stat().st_mtime_ns
    # Another block size: the same cached tokens, laid out afresh.
    wider = read(block_size=128)
    assert list(cache.glob("*.arrow")) == [written] and written.stat().st_mtime_ns == stamp
    assert len(wider.train_examples[0]) == 128 and len(first.train_examples[0]) == 64
    # Another tokenizer (one token added), then the file edited: each a cache of its own.
    tokenizer = byte_tokenizer()
    tokenizer.add_tokens(["zebra"])
    read(tokenizer, block_size=64)
    assert len(list(cache.glob("*.arrow"))) == 2
    write_parquet(parquet, [*embedded_rows()[:20], {"text": "zebra " * 300}])
    edited = read(block_size=64)
    assert len(list(cache.glob("*.arrow"))) == 3
    assert not same(
        edited.train_examples + edited.val_examples, first.train_examples + first.val_examples
    )


def test_a_tokenization_that_fails_or_dies_leaves_nothing_behind(
    tmp_path, datasets_home, monkeypatch
) -> None:
    """A full disk while tokenizing was a ``datasets`` traceback naming no path, and it, like a
    ``kill -9``, left its temporary file (51 MB for a probe's corpus) in the cache for good."""
    import datasets

    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:20])
    cache = Path(datasets_home["LIGHTNING_KD_CACHE"]) / DIRECTORY
    source = {"path": "parquet", "data_files": str(parquet)}
    real_map = datasets.Dataset.map

    def full_disk(self, *args, cache_file_name, **kwargs):
        Path(cache_file_name).with_name("tmpabc123").write_bytes(b"half a table")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "map", full_disk)
    with pytest.raises(OSError, match=f"no space left on {cache}/.*arrow: free space and run"):
        TextDataModule(byte_tokenizer(), dataset=source, block_size=64).setup()
    assert sorted(p.suffix for p in cache.iterdir()) == [".lock"]
    (cache / "0123abcd.partial").mkdir()  # a write killed mid-way: its lock is free now
    (cache / "0123abcd.partial" / "tmpxyz").write_bytes(b"rows")
    old = cache / "tmpold"  # beside the cache, from before partial folders
    old.write_bytes(b"rows")
    os.utime(old, (0, 0))
    monkeypatch.setattr(datasets.Dataset, "map", real_map)
    data = TextDataModule(byte_tokenizer(), dataset=source, block_size=64)
    data.setup()
    assert len(data.train_examples) > 0
    left = sorted(p.suffix for p in cache.iterdir() if p.suffix != ".lock")  # empty lock files
    assert left == [".arrow", ".sha256"]  # the entry and its receipt


@pytest.mark.parametrize("damage", ["cut", "overwritten"])
def test_a_damaged_tokenized_entry_is_tokenized_again(tmp_path, datasets_home, damage) -> None:
    """Cut short, every later run failed with pyarrow's traceback naming no file; overwritten
    in place, its ids read as -1 and the refusal blamed the tokenizer (probe 48)."""
    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:20])
    cache = Path(datasets_home["LIGHTNING_KD_CACHE"]) / DIRECTORY
    source = {"path": "parquet", "data_files": str(parquet)}
    first = TextDataModule(byte_tokenizer(), dataset=source, block_size=64)
    first.setup()
    (entry,) = cache.glob("*.arrow")
    size = entry.stat().st_size
    with open(entry, "r+b") as handle:
        if damage == "cut":
            handle.truncate(size // 3)
        else:
            handle.seek(size // 2)
            handle.write(b"\xff" * 256)
    again = TextDataModule(byte_tokenizer(), dataset=source, block_size=64)
    with pytest.warns(UserWarning, match=r"\.arrow: a tokenized cache entry whose bytes changed"):
        again.setup()
    assert same(again.train_examples, first.train_examples) and entry.stat().st_size == size


def test_a_saved_folder_json_lines_and_csv_read_the_same(tmp_path, datasets_home) -> None:
    import datasets

    rows = embedded_rows()[:30]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    datasets.Dataset.from_list(rows).to_csv(str(tmp_path / "d.csv"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    sources = [
        {"path": "json", "data_files": str(tmp_path / "d.jsonl")},
        {"path": "csv", "data_files": str(tmp_path / "d.csv")},
        {"path": str(tmp_path / "saved")},
    ]
    read = [TextDataModule(byte_tokenizer(), block_size=64, dataset=source) for source in sources]
    for data in read:
        data.setup()
    for data in read[1:]:
        assert same(data.train_examples, read[0].train_examples)
        assert same(data.val_examples, read[0].val_examples)
    assert read[2].provenance()["dataset"]["fingerprint"]  # a saved folder: its fingerprint


@pytest.mark.parametrize("where", ["builder", "folder"])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_a_text_file_is_one_document_as_in_data_files(
    tmp_path, datasets_home, where, streaming
) -> None:
    """datasets' text builder makes a row of each line: every line was a document with its EOS,
    blank lines dropped, repeated lines removed as duplicates (probe 46)."""
    folder = tmp_path / "txt"
    folder.mkdir()
    texts = [f"Chapter {i}\n\nIt was night.\nThe end.\n" for i in range(6)]
    for i, text in enumerate(texts):
        (folder / f"{i}.txt").write_text(text)
    source = {"path": "text", "data_files": str(folder / "*.txt")}
    source = {"path": str(folder)} if where == "folder" else source
    rows = open_split(DatasetSource.of(source), "train", streaming=streaming)
    assert sorted(row["text"] for row in rows) == sorted(texts)
    read = [
        TextDataModule(byte_tokenizer(), block_size=16, dataset=source),
        TextDataModule(byte_tokenizer(), block_size=16, files=sorted(map(str, folder.iterdir()))),
    ]
    for data in read:
        data.setup()
    assert same(read[0].train_examples, read[1].train_examples)


@pytest.mark.parametrize("where", ["builder", "folder"])
def test_csv_cells_are_read_as_the_text_they_are(tmp_path, datasets_home, where) -> None:
    """A CSV has no types: a text cell ``1000`` was read as an int and ``007`` as 7 (pandas
    guesses per column), an empty cell as a null, each then refused as "not a string". Now each
    is its text, and an empty row is left out as a blank JSON line is."""
    odd = ["1000", "007", "", "NA", "3.10", "null"]
    rows = [{"text": text} for text in odd + [row["text"] for row in embedded_rows()[:20]]]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    folder = tmp_path / "csv"
    folder.mkdir()
    with open(folder / "d.csv", "w", newline="", encoding="utf-8-sig") as handle:  # a BOM
        writer = csv.writer(handle)
        writer.writerows([["text", "id"], *([row["text"], i] for i, row in enumerate(rows))])
    source = {"path": "csv", "data_files": str(folder / "d.csv")}
    if where == "folder":
        source = {"path": str(folder)}
    streamed = open_split(DatasetSource.of(source), "train", streaming=True)
    assert [row["text"] for row in streamed][: len(odd)] == odd
    read = [
        TextDataModule(byte_tokenizer(), block_size=64, dataset=source),
        TextDataModule(byte_tokenizer(), block_size=64, files=[str(tmp_path / "d.jsonl")]),
    ]
    for data in read:
        data.setup()
    assert same(read[0].train_examples, read[1].train_examples)
    assert same(read[0].val_examples, read[1].val_examples)
    (tmp_path / "numbers.csv").write_text("text\n1000\n007\n")  # a column pandas took for ints
    numbers = {"path": "csv", "data_files": str(tmp_path / "numbers.csv")}
    assert open_split(DatasetSource.of(numbers), "train", streaming=False)["text"] == [
        "1000",
        "007",
    ]


@pytest.mark.parametrize("where", ["builder", "folder"])
def test_a_tsv_is_read_with_tabs(tmp_path, datasets_home, where) -> None:
    """``data.dataset.path=csv data_files=d.tsv`` was read with commas and refused for its
    missing text column (probe 46); a folder of them was read with tabs by datasets itself."""
    texts = ["a, b, c: commas in a tab-separated cell", "007", "", "one\ttab inside quotes"]
    folder = tmp_path / "tsv"
    folder.mkdir()
    with open(folder / "d.tsv", "w", newline="") as handle:
        csv.writer(handle, delimiter="\t").writerows([["id", "text"], *enumerate(texts)])
    source = {"path": "csv", "data_files": str(folder / "d.tsv")}
    if where == "folder":
        source = {"path": str(folder)}
    read = open_split(DatasetSource.of(source), "train", streaming=where == "folder")
    assert [row["text"] for row in read] == texts
    assert [row["id"] for row in read] == ["0", "1", "2", "3"]  # cells as text, as a CSV's


def test_a_validation_split_of_its_own(tmp_path, datasets_home) -> None:
    rows = embedded_rows()
    train = write_parquet(tmp_path / "train.parquet", rows[:30])
    val = write_parquet(tmp_path / "val.parquet", rows[28:34])  # two rows in both
    files = {"train": str(train), "validation": str(val)}
    source = {"path": "parquet", "data_files": files, "val_split": "validation"}
    data = TextDataModule(byte_tokenizer(), block_size=64, dataset=source)
    with pytest.warns(UserWarning, match=r"left 2 document\(s\) of data.dataset.split='train' "):
        data.setup()  # said, as data.val_files says it (probe 46)
    (tmp_path / "v.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[28:34]))
    alone = TextDataModule(byte_tokenizer(), block_size=64, files=[str(tmp_path / "v.jsonl")])
    assert same(data.val_examples, alone.examples([ids for _, ids in alone.documents()]))
    held_out = {tuple(e.tolist()) for e in data.val_examples}
    assert not held_out & {tuple(e.tolist()) for e in data.train_examples}


def chat_rows() -> list[dict]:
    return conversations(24)


def chat_from_files_and_dataset(jsonl, source: dict) -> tuple[ChatDataModule, ChatDataModule]:
    """Chat data modules set up from ``jsonl`` as ``data.files`` and from ``source``."""
    options = {"val_fraction": 0.25, "block_size": 160}
    files = ChatDataModule(chat_tokenizer(), files=[str(jsonl)], **options)
    dataset = ChatDataModule(chat_tokenizer(), dataset=source, **options)
    files.setup()
    dataset.setup()
    return files, dataset


def test_chat_rows_from_a_dataset_are_the_files_conversations(tmp_path, datasets_home) -> None:
    """Rows of both forms (messages; prompt and completion) in one table, as in the .jsonl."""
    rows = chat_rows()
    jsonl = write_rows(tmp_path / "c.jsonl", rows)
    parquet = write_parquet(tmp_path / "c.parquet", rows)
    files, dataset = chat_from_files_and_dataset(
        jsonl, {"path": "parquet", "data_files": str(parquet)}
    )
    for split in ("train_examples", "val_examples"):
        one, other = getattr(files, split), getattr(dataset, split)
        assert len(one) == len(other) > 0
        for a, b in zip(one, other, strict=True):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.labels, b.labels)
    batches = zip(files.train_dataloader(), dataset.train_dataloader(), strict=True)
    assert all(torch.equal(a["labels"], b["labels"]) for a, b in batches)


def test_a_validation_splits_openings_are_left_out_of_training(tmp_path, datasets_home) -> None:
    """data.dataset.val_split: a training row continuing a validation conversation, or the
    same turn under a system prompt, scored its answer in training (probe 46)."""
    from tests.unit.data.test_chat import continued, scored_answers

    rows = continued(6)
    train = write_parquet(tmp_path / "train.parquet", rows)
    val = write_parquet(tmp_path / "val.parquet", [rows[0], rows[3]])  # Q0, Q1's first turns
    files = {"train": str(train), "validation": str(val)}
    source = {"path": "parquet", "data_files": files, "val_split": "validation"}
    data = ChatDataModule(chat_tokenizer(), dataset=source)
    with pytest.warns(UserWarning, match=r"left 6 conversation\(s\) .* holds their openings"):
        training, held = data.split()
    assert scored_answers(held) == {"A0.", "A1."} and len(training) == 12
    assert scored_answers(held).isdisjoint(scored_answers(training))


def test_json_messages_whose_keys_differ_from_turn_to_turn(tmp_path, datasets_home) -> None:
    """One user turn with a ``name`` (TRL and OpenAI exports carry ``name``, ``tool_calls``):
    ``datasets`` types such a JSON column ``List(Json)``, and the rendered cache's own
    ``messages`` column came back decoded, a TypeError after "rendering … 80/80"."""
    rows = [
        {"messages": [{"role": "user", "content": f"Count to {i}."}, *TURNS[1:2]]}
        for i in range(12)
    ]
    rows[3]["messages"][0]["name"] = "bob"
    jsonl = write_rows(tmp_path / "c.jsonl", rows)
    files, dataset = chat_from_files_and_dataset(jsonl, {"path": "json", "data_files": str(jsonl)})
    for split in ("train_examples", "val_examples"):
        one, other = getattr(files, split), getattr(dataset, split)
        assert [a.tokens.tolist() for a in one] == [b.tokens.tolist() for b in other]


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_a_tables_tool_calls_render_as_the_files_do(tmp_path, datasets_home, streaming) -> None:
    """A table gives each struct every key any row's has: a get_weather call's arguments
    came back with search's query and limit as nulls, rendered and scored (probe 46)."""
    from tests.unit.data.test_chat import CHATML

    arguments = "message['tool_calls'] | map(attribute='function') | map(attribute='arguments')"
    template = CHATML.replace(
        "message['content'] + '<|im_end|>'",
        f"message['content'] + ({arguments} | map('tojson') | join(',') "
        "if message['tool_calls'] else '') + '<|im_end|>'",
    )
    calls = [("get_weather", {"city": "Oslo"}), ("search", {"query": "rain", "limit": 3})]
    rows = []
    for i in range(12):
        name, args = calls[i % 2]
        call = {"type": "function", "function": {"name": name, "arguments": args}}
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"Q{i}?"},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                ]
            }
        )
    jsonl = write_rows(tmp_path / "c.jsonl", rows)
    parquet = write_parquet(tmp_path / "c.parquet", rows)
    options = {"val_fraction": 0.25, "block_size": 160}
    files = ChatDataModule(chat_tokenizer(template), files=[str(jsonl)], **options)
    files.setup()
    source = {"path": "parquet", "data_files": str(parquet)}
    table = ChatDataModule(chat_tokenizer(template), dataset=source, **options)
    if streaming:
        table = ChatDataModule(chat_tokenizer(template), dataset=source, streaming=True, val_size=2)
    table.setup("fit")
    decode = chat_tokenizer().decode
    read = {decode(example.tokens) for example in [*files.train_examples, *files.val_examples]}
    assert '{"city": "Oslo"}' in "".join(read)
    for example in table.val_examples:
        assert "null" not in decode(example.tokens) and decode(example.tokens) in read


# Bad input: each refused naming what is wrong, what there is, and the fix.


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_a_file_that_is_not_utf8_or_cut_short_is_named_by_its_line(
    tmp_path, datasets_home, streaming
) -> None:
    """A latin-1 byte in a JSON-lines dataset was a UnicodeDecodeError traceback (datasets
    keeps the bytes unchecked); a text file's, or a line cut short, "cannot be opened ... set
    data.dataset.path" (probe 46). Each is named as data.files names it."""
    lines = [json.dumps({"text": f"row {i} " * 20}).encode() for i in range(10)]
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b"\n".join([*lines, b'{"text": "caf\xe9 na\xefve"}']) + b"\n")
    (tmp_path / "latin.txt").write_bytes("café crème".encode("latin-1"))
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join([*lines, b'{"text": "row 10 cut sh']) + b"\n")
    options = {"streaming": True, "val_size": 2} if streaming else {}
    byte = r"byte 0xe9 at column 14 is not UTF-8; re-encode"
    found = {
        ("json", latin): rf"latin.jsonl:11: {byte}" if not streaming else r"row 10 holds bytes",
        ("text", tmp_path / "latin.txt"): r"latin.txt:1: byte 0xe9 at column 4 is not UTF-8",
        ("json", cut): r"cut.jsonl:11 is not valid JSON",
    }
    for (builder, path), refusal in found.items():
        source = {"path": builder, "data_files": str(path)}
        data = TextDataModule(byte_tokenizer(), block_size=32, dataset=source, **options)
        with pytest.raises(Refused, match=refusal):
            data.setup("fit")
            list(data.train_dataloader())


def test_the_launchs_check_names_a_file_it_cannot_read_as_the_data_module_does(
    tmp_path, datasets_home, caplog, capsys
) -> None:
    """The checks before a launch read each split's first row: a line cut short, a text file
    that is not UTF-8, a parquet file cut short or a CSV quote left open was a traceback there,
    exit 1 (probe 52). datasets' own "[ERROR] Failed to load JSON" log line no longer comes
    first, and the JSON fault says where it is (it ended in "character at"), read without the
    line's end (a string cut short was called a control character: the newline; verify 57)."""
    from lightning_kd.data.dataset_columns import Columns, source_errors
    from lightning_kd.data.dataset_source import DatasetSource

    lines = [json.dumps({"text": f"row {i} " * 20}).encode() for i in range(7)]
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"\n".join([*lines, b'{"text": "broken', *lines]) + b"\n")
    (tmp_path / "latin.txt").write_bytes("café crème".encode("latin-1"))
    parquet = write_parquet(tmp_path / "whole.parquet", [{"text": "row " * 30}] * 200)
    (tmp_path / "cut.parquet").write_bytes(parquet.read_bytes()[: parquet.stat().st_size // 2])
    (tmp_path / "quote.csv").write_text('text,id\n"unclosed quote,1\nok,2\n')
    whole = gzip.compress(b"".join(b"line %d of a text\n" % i for i in range(4000)))
    (tmp_path / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    columns = Columns((("text",),), "data.text_field")
    found = {
        ("json", cut): r"cut.jsonl:8 is not valid JSON \(Unterminated string starting at col",
        ("text", tmp_path / "latin.txt"): r"latin.txt:1: byte 0xe9 at column 4 is not UTF-8",
        ("parquet", tmp_path / "cut.parquet"): r"cut.parquet cannot be read \(ArrowInvalid: ",
        ("csv", tmp_path / "quote.csv"): r"cannot be read \(ParserError: .*EOF inside string",
        ("text", tmp_path / "cut.txt.gz"): r"cut.txt.gz:\d+: not a readable gzip file",
    }
    for (builder, path), refusal in found.items():
        source = DatasetSource.of({"path": builder, "data_files": str(path)})
        errors = source_errors(source, columns)
        assert len(errors) == 1 and re.search(refusal, errors[0]), errors
    assert not [r for r in caplog.records if r.name.startswith("datasets")], caplog.text
    assert "Failed to load" not in capsys.readouterr().err


def test_a_split_of_no_row_is_named_not_the_builder(tmp_path, datasets_home) -> None:
    """datasets cannot open a {split: files} whose split is empty: the refusal said "cannot be
    opened ... set data.dataset.path" (probe 46)."""
    train = write_parquet(tmp_path / "tr.parquet", [{"text": "x " * 100}] * 10)
    empty = tmp_path / "zero.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=pa.schema([("text", pa.string())])), empty)
    files = {"train": str(train), "validation": str(empty)}
    source = {"path": "parquet", "data_files": files, "val_split": "validation"}
    with pytest.raises(Refused, match=r"split 'validation' \(.*zero.parquet\) holds no row"):
        TextDataModule(byte_tokenizer(), block_size=32, dataset=source).setup()


def test_a_missing_column_names_the_columns_there_are(tmp_path, datasets_home) -> None:
    parquet = write_parquet(tmp_path / "d.parquet", [{"body": "x" * 300, "id": 1}])
    source = {"path": "parquet", "data_files": str(parquet)}
    text = r"split 'train' has no column 'text'; its columns: \['body', 'id'\]; set data.text_field"
    with pytest.raises(Refused, match=text):
        TextDataModule(byte_tokenizer(), dataset=source).setup()
    chat = ChatDataModule(chat_tokenizer(), dataset=source)
    either = r"has neither column 'messages' nor 'prompt' and 'completion' nor 'instruction' "
    either += r"and 'output' nor 'conversations'; its columns: "
    with pytest.raises(Refused, match=either + r"\['body', 'id'\]; set data.messages_field"):
        chat.setup()
    # Rows of the other kind: the fix is the data module.
    text_rows = write_parquet(tmp_path / "t.parquet", [{"text": "x" * 300}])
    text_source = {"path": "parquet", "data_files": str(text_rows)}
    with pytest.raises(Refused, match=r"or read the texts with data=text \(the default\)"):
        ChatDataModule(chat_tokenizer(), dataset=text_source).setup()
    chat_rows = write_parquet(tmp_path / "c.parquet", [{"prompt": "a", "completion": "b"}])
    chat_source = {"path": "parquet", "data_files": str(chat_rows)}
    with pytest.raises(Refused, match=r"or read the conversations with data=chat"):
        TextDataModule(byte_tokenizer(), dataset=chat_source).setup()
    # data=text told to read the texts with data=text, as it did (probe 33): its column's name
    with pytest.raises(Refused, match=r"its columns: \['text'\]; set data.text_field=text, the"):
        TextDataModule(byte_tokenizer(), dataset=text_source, text_field="body").setup()


def test_a_missing_split_names_the_splits_there_are(tmp_path, datasets_home) -> None:
    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:5])
    source = {"path": "parquet", "data_files": str(parquet), "split": "validation"}
    message = (
        r"data.dataset.split='validation': data.dataset 'parquet' \(data_files '.*d.parquet'\) "
        r"has no split 'validation'; its splits: \['train'\]; set data.dataset.split to one"
    )
    with pytest.raises(Refused, match=message):
        TextDataModule(byte_tokenizer(), dataset=source).setup()
    with pytest.raises(Refused, match=r"data.dataset.val_split='test': .* its splits: \['train'\]"):
        source = {"path": "parquet", "data_files": str(parquet), "val_split": "test"}
        TextDataModule(byte_tokenizer(), dataset=source).setup()


def test_text_that_is_not_a_string_names_its_row(tmp_path, datasets_home) -> None:
    """A JSON column of numbers: every row is one; the first is named."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": 7}) + "\n" for _ in range(3)))
    source = {"path": "json", "data_files": str(path)}
    message = r"split 'train' row 0: column 'text' holds int 7, not a string; give every "
    with pytest.raises(Refused, match=message + "row text, or set data.text_field"):
        TextDataModule(byte_tokenizer(), dataset=source).setup()


def test_a_null_text_is_left_out_as_an_empty_one_is(tmp_path, datasets_home) -> None:
    """A null is parquet's missing cell: refused, where an empty string was left out (probe
    37). Read whole or streamed, both are left out; a column of nulls alone holds no text."""
    rows = [{"text": f"fine text number {i} " * 20} for i in range(6)]
    rows[3]["text"], rows[4]["text"] = None, ""
    path = write_parquet(tmp_path / "d.parquet", rows)
    source = {"path": "parquet", "data_files": str(path)}
    whole = TextDataModule(byte_tokenizer(), block_size=32, dataset=source)
    whole.setup()
    texts = "".join(whole.tokenizer.decode(b.tolist()) for b in whole.train_examples)
    assert "number 5" in texts or "number 5" in "".join(
        whole.tokenizer.decode(b.tolist()) for b in whole.val_examples
    )
    nulls = write_parquet(tmp_path / "n.parquet", [{"text": None, "id": i} for i in range(4)])
    with pytest.raises(Refused, match=r"holds no text \(every row's 'text' is blank\)"):
        TextDataModule(
            byte_tokenizer(), dataset={"path": "parquet", "data_files": str(nulls)}
        ).setup()


def test_an_empty_dataset_is_refused(tmp_path, datasets_home) -> None:
    schema = pa.schema([("text", pa.string())])
    path = write_parquet(tmp_path / "d.parquet", [], schema=schema)
    source = {"path": "parquet", "data_files": str(path)}
    with pytest.raises(Refused, match=r"d.parquet'\) split 'train' is empty \(no rows\)"):
        TextDataModule(byte_tokenizer(), dataset=source).setup()


def test_a_chat_row_without_an_assistant_turn_names_its_row(tmp_path, datasets_home) -> None:
    rows = [{"messages": TURNS} for _ in range(4)]
    rows[2] = {"messages": TURNS[:1]}
    path = write_parquet(tmp_path / "c.parquet", rows)
    data = ChatDataModule(chat_tokenizer(), dataset={"path": "parquet", "data_files": str(path)})
    message = r"split 'train' row 2 has no assistant turn, so nothing in it would be scored; "
    with pytest.raises(Refused, match=message + "give each row the answer"):
        data.setup()


def test_a_dataset_with_files_says_which_to_drop(tmp_path, corpus) -> None:
    source = {"path": "parquet", "data_files": "d.parquet"}
    message = (
        r"data.dataset.path='parquet' and data.files=\[.*\] both name the data: drop one "
        r"\(data.files=null to read the dataset, or data.dataset.path=null to read the files\)"
    )
    with pytest.raises(Refused, match=message):
        TextDataModule(byte_tokenizer(), files=[str(corpus)], dataset=source)


def test_a_name_datasets_cannot_open_is_refused_with_its_reason(tmp_path, datasets_home) -> None:
    hub = {"path": "someone/no-such-dataset"}
    with pytest.raises(Refused, match=r"'someone/no-such-dataset' cannot be opened here"):
        TextDataModule(byte_tokenizer(), dataset=hub).setup()


def test_the_common_causes_of_a_dataset_that_cannot_open_are_named(tmp_path, datasets_home):
    """Each used to be datasets' own words under advice about data.dataset.path: a glob that
    matches nothing (``StopIteration: ``), a data file given as the path (the hub was asked), a
    cache datasets cannot write, and datasets' split slicing."""
    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:20])
    cases = [
        ({"path": "parquet", "data_files": str(tmp_path / "nowhere.parquet")}, "match(es) no"),
        ({"path": "json", "data_files": str(tmp_path / "none" / "*.jsonl")}, "match(es) no file"),
        (
            {"path": str(parquet)},
            f"is a file; a file is read by a builder: data.dataset.path=parquet "
            f"data.dataset.data_files={parquet}",
        ),
        (
            {"path": "parquet", "data_files": str(parquet), "split": "train[:50]"},
            "slices and sums of splits are not read: name one split, and cap its rows with "
            "data.max_train_examples",
        ),
    ]
    for source, message in cases:  # as the run's check reads them, before tokenizing
        with pytest.raises(Refused, match=re.escape(message)):
            TextDataModule(byte_tokenizer(), dataset=source, streaming=True).setup()
    read_only = OSError(errno.EROFS, "Read-only file system", "/ro/hf")
    source = DatasetSource.of({"path": "parquet", "data_files": str(parquet)})
    assert "set HF_DATASETS_CACHE to a directory you can write" in open_hint(source, read_only)
    hub = DatasetSource.of({"path": "org/corpus", "data_files": "data/*.parquet"})
    assert open_hint(hub, ConnectionError("offline")) is None  # the repository's files, not here


def test_an_edit_in_place_whose_mtime_was_put_back_is_read(tmp_path, datasets_home) -> None:
    """A same-size edit of a dataset file, its mtime put back (``cp -p``, ``rsync -t``): the
    digest was remembered by mtime, and ``datasets`` served its Arrow files of the old text,
    keyed by mtime too; the run trained on the old text, silently (probe 37)."""
    rows = tmp_path / "rows.jsonl"
    texts = [f"Document number {i} tells of the teacher and the student." for i in range(12)]
    rows.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(rows, ns=(hour_ago, hour_ago))
    source = {"path": "json", "data_files": str(rows)}

    def decoded() -> str:
        data = TextDataModule(byte_tokenizer(), block_size=64, dataset=source)
        data.setup()
        blocks = [*data.train_examples, *data.val_examples]
        return "".join(data.tokenizer.decode(block.tolist()) for block in blocks)

    assert "TEACHER" not in decoded()
    rows.write_bytes(rows.read_bytes().replace(b"teacher", b"TEACHER", 1))  # as many bytes
    os.utime(rows, ns=(hour_ago, hour_ago))
    assert "TEACHER" in decoded()


def test_a_resume_on_other_data_names_what_changed(tmp_path, datasets_home) -> None:
    import datasets

    parquet = write_parquet(tmp_path / "d.parquet", embedded_rows()[:20])

    def record(source: dict) -> dict:
        data = TextDataModule(byte_tokenizer(), block_size=64, dataset=source)
        data.setup()
        return data.provenance()

    source = {"path": "parquet", "data_files": str(parquet)}
    saved = record(source)
    assert data_differences(saved, record(source)) == []
    other = {**saved["dataset"], "split": "other"}
    assert data_differences(saved, saved | {"dataset": other}) == [
        "data.dataset.split: checkpoint 'train', this run 'other'"
    ]
    write_parquet(parquet, embedded_rows()[1:21])
    edited = data_differences(saved, record(source))
    assert f"data.dataset.data_files: edited ['{parquet}']" in edited
    folder = str(tmp_path / "saved")
    datasets.Dataset.from_list(embedded_rows()[:20]).save_to_disk(folder)
    before = record({"path": folder})
    datasets.Dataset.from_list(embedded_rows()[1:21]).save_to_disk(folder)
    changed = data_differences(before, record({"path": folder}))
    assert any("the saved folder's fingerprint is" in line for line in changed)


def test_a_quoted_end_token_is_text_from_files_datasets_and_streams(tmp_path, datasets_home):
    """A document quoting the tokenizer's EOS string (``<eos>``) is read as its characters: the
    only end tokens in the packed blocks are the ones that separate documents."""
    rows = [{"text": f"document {i} quotes the string <eos> in its text."} for i in range(40)]
    files = TextDataModule(
        byte_tokenizer(), files=[str(write_rows(tmp_path / "quotes.jsonl", rows))], block_size=32
    )
    parquet = write_parquet(tmp_path / "quotes.parquet", rows)
    source = {"path": "parquet", "data_files": str(parquet)}
    dataset = TextDataModule(byte_tokenizer(), dataset=source, block_size=32)
    for data in (files, dataset):
        data.setup("fit")
        blocks = torch.cat([*data.train_examples, *data.val_examples])
        assert int((blocks == 256).sum()) <= len(rows)  # parsed: two per document
    assert same(files.train_examples, dataset.train_examples)
    text = rows[0]["text"]
    _, streamed = streamed_tokens(byte_tokenizer(), {"text": text}, "text", True, "row 0")
    assert streamed[-1] == 256 and 256 not in streamed[:-1].tolist()
    assert byte_tokenizer().decode(streamed[:-1]) == text


def test_a_home_folder_tilde_is_expanded_as_in_data_files() -> None:
    """'data.dataset.data_files=~/d.jsonl' looked for a folder named ~ (probe 46)."""
    source = DatasetSource.of({"path": "json", "data_files": {"train": ["~/a.jsonl"], "v": "~/b"}})
    home = str(Path.home())
    assert source.data_files == {"train": [f"{home}/a.jsonl"], "v": f"{home}/b"}
    assert DatasetSource.of({"path": "~/saved"}).path == f"{home}/saved"
    assert DatasetSource.of({"path": "json", "data_files": "a/~b"}).data_files == "a/~b"
