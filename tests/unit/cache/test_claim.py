"""One writer per cache directory at a time."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from lightning_kd.cache import CacheError, TeacherCache
from lightning_kd.cache.format import READERS_LOCK, WRITER_LOCK
from lightning_kd.cache.reader import read_index
from lightning_kd.cache.writer import write_cache
from lightning_kd.launch.cache import write
from lightning_kd.launch.config import compose_config
from lightning_kd.models.loading import load_teacher
from lightning_kd.utils.locks import WriterLocked, in_use_elsewhere
from lightning_kd.utils.refusal import Refused
from tests.conftest import make_datamodule
from tests.unit.cache.test_cache import SPEC
from tests.unit.utils.test_locks import free, held_by_another_process, read_by_another_process


def test_a_second_cache_writer_is_refused_until_the_first_ends(
    tiny_teacher, corpus, tmp_path
) -> None:
    """Two writers into one directory: the second is refused at once, naming the first's pid
    (the `lightning-kd cache` command before it loads anything); the lock goes with the first
    writer, kill -9 included, and is released once a write is done."""
    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    lock = directory / WRITER_LOCK
    with held_by_another_process(lock) as holder:
        refused = (
            rf"teacher cache {re.escape(str(directory))} is being written by another process "
            rf"\(pid {holder.pid}, .*another directory \(hydra.run.dir=\.\.\.\)"
        )
        with pytest.raises(WriterLocked, match=refused):
            write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
        cfg = compose_config(["debug=smoke", f"data.files=[{corpus}]"], output_dir=directory)
        with pytest.raises(WriterLocked, match=refused) as locked:
            write(cfg)
        assert isinstance(locked.value, Refused)  # lightning-kd cache: exit 2, no traceback
        assert sorted(p.name for p in directory.iterdir()) == [WRITER_LOCK]  # nothing written
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    assert free(lock)
    TeacherCache.open(directory)


def test_a_cache_being_written_is_named_so_to_a_run_that_would_read_it(tmp_path: Path) -> None:
    """A run started on a cache still being written was told its writer "stopped before
    finishing; run it again", and running it again was refused as in use (probe 23)."""
    directory = tmp_path / "cache"
    directory.mkdir()
    (directory / "meta.json").write_text("{}")
    with held_by_another_process(directory / WRITER_LOCK) as holder:
        with pytest.raises(CacheError) as error:
            read_index(directory)
        assert str(error.value) == (
            f"{directory} holds no complete teacher cache yet: it is being written (pid "
            f"{holder.pid}); start this run once that writer has finished"
        )
    with pytest.raises(CacheError, match="its writer stopped before finishing; run it again"):
        read_index(directory)  # the writer gone, what it left is named as before


def test_shards_without_the_record_of_their_settings_are_not_completed(
    tiny_teacher, corpus, tmp_path
) -> None:
    """A cache that lost its meta.json, written again at T = 2: every T = 1 shard was kept
    (receipts name no settings) under an index saying T = 2, and a T = 2 run trained on them
    (probe 23)."""
    from dataclasses import replace

    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    (directory / "meta.json").unlink()
    hotter = replace(SPEC, temperature=2.0)
    with pytest.raises(CacheError, match=r"holds cache shards but no meta.json, the record of"):
        write_cache(teacher, datamodule.tokenizer, datamodule, hotter, directory)
    stats = write_cache(
        teacher, datamodule.tokenizer, datamodule, hotter, directory, overwrite=True
    )
    assert stats.shards_kept == 0
    assert TeacherCache.open(directory).key.temperature == 2.0


def test_a_damaged_record_of_the_settings_is_named_with_the_fix(tiny_teacher, corpus, tmp_path):
    """A meta.json cut short was a JSONDecodeError traceback that named no file (probe 59)."""
    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    meta = directory / "meta.json"
    meta.write_text(meta.read_text()[:100])
    (directory / "index.json").unlink()
    refused = rf"^{meta} cannot be read \(.*\): pass overwrite=true to write"
    with pytest.raises(Refused, match=refused):
        write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory, overwrite=True)
    TeacherCache.open(directory)


def test_a_cache_a_run_reads_is_not_replaced_under_it(tiny_teacher, corpus, tmp_path) -> None:
    """`lightning-kd cache overwrite=true` into a cache a training run read went ahead: the run
    stopped at its next shard read, its cache gone (probe 23, F2). Now the writer is refused
    before it removes anything, until the reader ends; completing the cache is not refused."""
    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    shards = {p.name: p.stat().st_mtime_ns for p in (directory / "shards").glob("*.safetensors")}
    cfg = compose_config(
        ["debug=smoke", f"data.files=[{corpus}]", "overwrite=true"], output_dir=directory
    )
    replace_it = f"{directory} holds a teacher cache that a training run is reading now"
    with read_by_another_process(directory / READERS_LOCK):
        with pytest.raises(CacheError, match=re.escape(replace_it)) as refused:
            write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory, overwrite=True)
        assert "cache.dir=... for distill.teacher_cache=auto" in str(refused.value)
        with pytest.raises(CacheError, match=re.escape(replace_it)):
            write(cfg)  # the command, before its ranks start
        kept = write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
        assert kept.shards_kept == len(shards)
    assert {
        p.name: p.stat().st_mtime_ns for p in (directory / "shards").glob("*.safetensors")
    } == shards
    TeacherCache.open(directory)
    assert not in_use_elsewhere(directory / READERS_LOCK)  # this process's own hold let go
    stats = write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory, overwrite=True)
    assert stats.shards_kept == 0


def test_a_whole_cache_being_written_again_is_not_opened(tiny_teacher, corpus, tmp_path) -> None:
    """A run starting while a writer holds a whole cache (about to replace or complete it) read
    it, and stopped mid-training once the writer reached its shards; it is refused at once,
    holding no reader's lock (which would refuse that writer's overwrite)."""
    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    with held_by_another_process(directory / WRITER_LOCK) as holder:
        with pytest.raises(CacheError) as error:
            TeacherCache.open(directory)
        assert str(error.value) == (
            f"{directory} holds a teacher cache: it is being written (pid {holder.pid}); start "
            "this run once that writer has finished"
        )
        assert free(directory / READERS_LOCK)
    TeacherCache.open(directory)


def test_a_writer_is_told_which_stored_modules_differ_and_a_record_alone_is_replaced(
    tiny_teacher, corpus, tmp_path
) -> None:
    """A cache storing more teacher modules than this writer serves a run, but this writer cannot
    complete it: the refusal said only "format or fields differ". A refused writer's meta.json
    with no shard behind it (a module its teacher lacked) refused the corrected command the same
    way (probe 38)."""
    import shutil

    teacher = load_teacher(tiny_teacher)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    args = (teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    write_cache(*args, features=["model.layers.1"])
    with pytest.raises(CacheError) as refused:
        write_cache(*args)
    assert "features: the cache stores teacher modules ['model.layers.1'], this writer []" in (
        str(refused.value)
    )
    assert "format or fields differ" not in str(refused.value)
    shutil.rmtree(directory / "shards")  # the record of settings alone, nothing written under it
    (directory / "index.json").unlink()
    stats = write_cache(*args)
    assert stats.shards_kept == 0 and TeacherCache.open(directory).key.features == ()
