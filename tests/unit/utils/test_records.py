"""A record the package wrote, read back: damaged ones named with the fix."""

from __future__ import annotations

import pytest

from lightning_kd.utils.records import DamagedRecord, read_record


def test_a_record_cut_short_zero_filled_or_of_another_shape_is_named(tmp_path) -> None:
    path = tmp_path / "meta.json"
    path.write_text('{"key": {"k": 8}}')
    assert read_record(path, "fix it") == {"key": {"k": 8}}
    for damaged, reason in [
        (b'{"key": {"k', r"Unterminated string starting at: line 1 column 10 \(char 9\)"),
        (b"\0" * 64, r"Expecting value: line 1 column 1 \(char 0\)"),
        (b"\xff\xfe{}", r"'utf-8' codec can't decode byte 0xff in position 0"),
    ]:
        path.write_bytes(damaged)
        with pytest.raises(DamagedRecord, match=rf"^{path} cannot be read \({reason}.*\): fix it$"):
            read_record(path, "fix it")
    path.write_text("[1, 2]")
    with pytest.raises(DamagedRecord, match=rf"^{path} holds a list, not a record: fix it$"):
        read_record(path, "fix it")
