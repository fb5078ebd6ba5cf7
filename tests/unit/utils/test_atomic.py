"""Directories written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_kd.utils.atomic import atomic_directory


def test_a_directory_appears_whole_or_not_at_all(tmp_path) -> None:
    target = tmp_path / "converted"
    with (
        pytest.raises(RuntimeError, match="killed mid-write"),
        atomic_directory(target) as staging,
    ):
        (staging / "config.json").write_text("{}")
        assert not target.exists()
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []  # no target, no temporary left
    with atomic_directory(target) as staging:
        (staging / "config.json").write_text("{}")
    assert [p.name for p in tmp_path.iterdir()] == ["converted"]
    assert (target / "config.json").read_text() == "{}"


def test_a_killed_writers_leftover_goes_and_a_live_or_foreign_ones_stay(tmp_path) -> None:
    """``kill -9`` mid-write left ``.name.<pid>.partial`` for good (up to a whole model's size):
    the next write of the same file removes this machine's leftovers of dead writers."""
    import socket
    import subprocess
    import sys

    from lightning_kd.utils.atomic import replaced_whole

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    host = socket.gethostname()
    target = tmp_path / "student.f16.gguf"
    leftovers = {
        "killed": tmp_path / f".student.f16.gguf.{host}-{dead}.partial",
        "live": tmp_path / f".student.f16.gguf.{host}-{os.getppid()}.partial",
        "another machine's": tmp_path / f".student.f16.gguf.elsewhere-{dead}.partial",
    }
    for path in leftovers.values():
        path.write_bytes(b"half")
    with replaced_whole(target) as temp:
        temp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole"
    assert not leftovers["killed"].exists()
    assert leftovers["live"].exists() and leftovers["another machine's"].exists()


def test_a_signal_mid_write_leaves_the_previous_file_and_no_leftover(tmp_path) -> None:
    import signal

    from lightning_kd.utils.atomic import replaced_whole
    from lightning_kd.utils.stopping import Interrupted, stopping_at_once

    target = tmp_path / "student.f16.gguf"
    target.write_bytes(b"the previous export")
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(Interrupted, match="SIGTERM received: stopped the export") as stop,
        stopping_at_once("the export"),
        replaced_whole(target) as temp,
    ):
        temp.write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.exit_code == 143
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    assert target.read_bytes() == b"the previous export"
    assert signal.getsignal(signal.SIGTERM) == before  # the handler before is back


def test_a_directory_is_replaced_whole_or_left_as_it_was(tmp_path: Path) -> None:
    """The exported student was written in place: killed mid-export, student/ held a
    config.json and no weights, which export and evaluate took for a model (probe 23)."""
    from lightning_kd.utils.atomic import replaced_directory

    target = tmp_path / "student"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(RuntimeError), replaced_directory(target) as temp:
        (temp / "config.json").write_text("half")
        raise RuntimeError("killed mid-export")
    assert (target / "config.json").read_text() == "old"
    with replaced_directory(target) as temp:
        (temp / "config.json").write_text("new")
        (temp / "model.safetensors").write_text("weights")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student"]  # no leftover
