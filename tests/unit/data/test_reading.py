"""Reading data.files: errors at file:line, format by suffix, duplicates read once."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from lightning_kd.data.errors import DataError
from lightning_kd.data.reading import (
    DEFAULT_FILES,
    cut_texts,
    distinct_documents,
    expand_files,
    read_documents,
    read_records,
)
from tests.conftest import make_datamodule


def jsonl(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_decode_errors_name_the_file_and_line(tmp_path: Path) -> None:
    lines = tmp_path / "a.jsonl"
    lines.write_bytes(b'{"text": "ok"}\n\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=rf"{lines}:3: byte 0xe9 at column 14 is not UTF-8"):
        list(read_documents(lines))
    text = tmp_path / "b.txt"
    text.write_bytes(b"first line\nsecond \xff line\n")
    with pytest.raises(ValueError, match=rf"{text}:2: byte 0xff at column 8 is not UTF-8"):
        list(read_documents(text))


def test_gzip_errors_name_the_file(tmp_path: Path) -> None:
    fake = tmp_path / "plain.jsonl.gz"
    fake.write_text('{"text": "not compressed"}\n')
    with pytest.raises(ValueError, match=rf"{fake}:1: not a readable gzip file"):
        list(read_documents(fake))
    whole = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=rf"{cut}:\d+: not a readable gzip file"):
        list(read_documents(cut))
    # Chat rows and prompts (read_records) and the scan for rows cut short (evaluate --files)
    # read the same files unwrapped: EOFError and BadGzipFile tracebacks (probe 52).
    for reading in (read_records, lambda path: cut_texts([path])):
        for bad in (fake, cut):
            with pytest.raises(DataError, match=rf"{bad}:\d+: not a readable gzip file"):
                list(reading(bad))


def test_the_format_comes_from_the_suffix_only(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "notes.txt.jsonl", {"text": "one"}, {"text": "two"})
    assert list(read_documents(path)) == ["one", "two"]


@pytest.mark.parametrize("value", [3, None, ["a"], {"t": "x"}, True])
def test_text_that_is_not_a_string_is_refused(tmp_path: Path, value: object) -> None:
    path = jsonl(tmp_path / "d.jsonl", {"text": "fine"}, {"text": value})
    with pytest.raises(ValueError, match=rf"{path}:2: field 'text' holds \w+ .*not a string"):
        list(read_documents(path))


def test_one_file_named_twice_is_read_once(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "a.jsonl", {"text": "alpha"})
    copy = tmp_path / "sub" / "copy.jsonl"
    copy.parent.mkdir()
    copy.write_bytes(a.read_bytes())
    b = jsonl(tmp_path / "b.jsonl", {"text": "beta"})
    with pytest.warns(UserWarning) as caught:
        files = expand_files([str(a), str(tmp_path / "*.jsonl"), str(copy)])
    assert files == [a, b]
    messages = [str(w.message) for w in caught]
    assert f"data.files: {a} is the same file as {a}: read once" in messages
    assert f"data.files: {copy} is identical in content to {a}: read once" in messages


def test_duplicate_documents_are_kept_once(tmp_path: Path) -> None:
    records = [{"text": f"document number {i % 10} " * 3} for i in range(40)]
    path = jsonl(tmp_path / "dup.jsonl", *records)
    data = make_datamodule([path], pack=False, val_fraction=0.3)
    with pytest.warns(UserWarning, match=r"removed 30 duplicate document\(s\) of 40") as caught:
        data.setup()
    # It says where, so that the repeats can be found.
    assert f"e.g. {path}:11 repeats {path}:1, {path}:12 repeats {path}:2" in str(caught[0].message)
    train = {tuple(x.tolist()) for x in data.train_examples}
    val = {tuple(x.tolist()) for x in data.val_examples}
    assert len(train) + len(val) == 10 and not train & val


def test_blank_documents_are_left_out_not_counted_as_repeats(tmp_path: Path) -> None:
    """A file of whitespace documents was said to hold 9 duplicates of 10, before the refusal
    that it holds no text (probe 37); blanks beside text are no repeats either."""
    import warnings

    blank = jsonl(tmp_path / "blank.jsonl", *[{"text": "   "} for _ in range(10)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"no text in .*blank.jsonl'\]: empty, or only"):
            distinct_documents([blank])
        mixed = jsonl(tmp_path / "mixed.jsonl", {"text": " "}, {"text": "a"}, {"text": "\n"})
        assert distinct_documents([mixed]) == [(f"{mixed}:2", "a")]


def test_an_empty_file_list_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data.files is empty; .*data.files=null"):
        make_datamodule([])


def test_a_byte_order_mark_is_dropped(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    rows = tmp_path / "bom.jsonl"
    rows.write_bytes(bom + b'{"text": "first"}\r\n{"text": "second"}\n')
    text = tmp_path / "bom.txt"
    text.write_bytes(bom + b"Notepad text")
    assert list(read_documents(rows)) == ["first", "second"]
    assert list(read_documents(text)) == ["Notepad text"]
    assert next(read_records(rows)) == (1, {"text": "first"})


def test_a_directory_entry_suggests_a_glob_and_a_missing_one_says_so(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("a.jsonl", "b.jsonl", "notes.txt"):
        (shards / name).write_text('{"text": "x"}\n')
    # The glob suggested is one a user can paste: the suffix most of its files have.
    with pytest.raises(
        FileNotFoundError, match=r"'.*shards' is a directory; .*'.*shards/\*\.jsonl'"
    ):
        expand_files([str(shards)])
    with pytest.raises(FileNotFoundError, match=r"--files entry '.*none.txt' does not exist$"):
        expand_files([str(tmp_path / "none.txt")], key="--files")


def test_the_shipped_corpus_repeat_is_not_warned_about() -> None:
    """Two Python reference topics share one text (its README says so): every default run
    warned of it, with the path of the installed package."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        documents = distinct_documents(DEFAULT_FILES)
    assert len(documents) == 79 + 224 - 1


def test_a_conversation_rendered_to_text_is_said(tmp_path) -> None:
    """Rendered ChatML in a text column trained its markers as characters and scored its
    prompts, without a word (probe 46); prose without markers says nothing."""
    from lightning_kd.data.reading import distinct_documents

    rendered = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"text": rendered}) + "\n" + json.dumps({"text": "prose"}) + "\n")
    with pytest.warns(UserWarning, match=r"chat turn marker '<\|im_start\|>'.*data=chat"):
        distinct_documents([path])
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"text": "prose only"}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        distinct_documents([plain])


def test_paths_from_python_are_read_as_their_strings_are(tmp_path) -> None:
    """``TextDataModule(files=[Path(...)])`` failed with "argument of type 'PosixPath' is not
    iterable" inside the glob check (probe 58's re-run)."""
    from lightning_kd.data.reading import expand_files

    (tmp_path / "a.txt").write_text("some text")
    assert expand_files([tmp_path / "a.txt"]) == expand_files([str(tmp_path / "a.txt")])
    assert expand_files(Path(tmp_path / "*.txt")) == [tmp_path / "a.txt"]
