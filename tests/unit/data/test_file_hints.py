"""What ``data.files`` and ``evaluate --files`` say of a file or row they do not read
(``data/file_hints.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_kd.data.reading import expand_files, read_documents


def test_a_table_file_is_told_what_reads_it(tmp_path) -> None:
    """A parquet file was told only "use one of .txt, .jsonl, ..." (probe 46)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "held.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "held-out text"}]), table)
    with pytest.raises(ValueError) as training:
        expand_files([str(table)])
    assert str(training.value).endswith(
        f"a parquet file is read with data.dataset.path=parquet data.dataset.data_files={table}"
    )
    with pytest.raises(ValueError) as evaluate:
        expand_files([str(table)], key="--files")
    command = str(evaluate.value).split("written as JSON lines first: ")[1]
    assert command.startswith("python -c ")
    code = command.removeprefix("python -c ").strip('"')
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)  # what it advises
    assert list(read_documents(tmp_path / "held.jsonl")) == ["held-out text"]


def test_a_conversation_given_to_evaluate_files_is_pointed_at_prompts(tmp_path) -> None:
    """It was told to "read chat rows with data=chat", which evaluate takes no config for."""
    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"evaluate --files scores text; .* evaluate --prompts"):
        list(read_documents(path, key="--text-field"))
    with pytest.raises(ValueError, match=r"read chat rows with data=chat"):
        list(read_documents(path))


def test_a_file_whose_name_is_not_utf8_is_named(tmp_path) -> None:
    """Matched by a glob, it failed the run with a UnicodeEncodeError naming no file (probe 48)."""
    import os

    folder = os.fsencode(tmp_path)
    with open(folder + b"/caf\xe9.txt", "wb") as handle:
        handle.write(b"text")
    with pytest.raises(ValueError) as refused:
        expand_files([f"{tmp_path}/*.txt"])
    assert str(refused.value) == (
        f"data.files entry {tmp_path}/caf\\xe9.txt: its name is not UTF-8; rename the file"
    )
