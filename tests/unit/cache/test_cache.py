"""The teacher cache: what it stores, how it resumes, and every bad cache refused on opening."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from lightning_kd.cache import CacheError, CacheMismatch, CacheSpec, TeacherCache, cache_key
from lightning_kd.cache.narrow import narrow_cache, without_features
from lightning_kd.cache.reader import TRAINING_OUTPUTS, read_index
from lightning_kd.cache.writer import ShardWriter, write_cache
from lightning_kd.launch.cache import cached_teacher, write
from lightning_kd.launch.config import compose_config
from lightning_kd.losses.logits import math_dtype
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.training.rundir import OUTPUTS
from lightning_kd.utils.stopping import STOP, Interrupted
from tests.conftest import ROOT, TINY_LLAMA, make_datamodule

SPEC = CacheSpec(k=8, shard_blocks=3, batch_size=2)


@pytest.fixture(scope="module")
def teacher() -> torch.nn.Module:
    return load_teacher(TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"))


@pytest.fixture(scope="module")
def written(tmp_path_factory, teacher) -> tuple[Path, object]:
    """A cache of the tiny teacher over a small corpus, and its data module."""
    root = tmp_path_factory.mktemp("cache")
    corpus = root / "corpus.txt"
    corpus.write_text("Sphinx of black quartz, judge my vow. " * 60)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, root / "cache")
    return root / "cache", datamodule


def expected(teacher, datamodule, **changes) -> object:
    """The key a run with ``datamodule`` (and ``changes`` to the cache settings) expects."""
    options = {"k": SPEC.k, "temperature": SPEC.temperature} | changes
    return cache_key(teacher, datamodule.tokenizer, datamodule, **options)


def test_records_are_the_teachers_top_k_and_tail(written, teacher) -> None:
    directory, datamodule = written
    cache = TeacherCache.open(directory, expect=expected(teacher, datamodule))
    for split, examples in (("train", datamodule.train_examples), ("val", datamodule.val_examples)):
        picked = [len(examples) - 1, 0, 4][: len(examples)]  # any order, across shards
        records = cache.records(split, picked)
        batch = datamodule.collate([examples[i] for i in picked])
        with torch.no_grad():
            logits = teacher(input_ids=batch["input_ids"]).logits[:, :-1]
        log_probs = torch.log_softmax(logits.to(math_dtype(logits.dtype)), -1)
        top, ids = log_probs.topk(SPEC.k, -1)
        assert torch.equal(records.ids, ids)
        assert torch.allclose(records.log_probs, top, atol=4e-3, rtol=1e-3)  # fp16
        rest = log_probs.scatter(-1, ids, float("-inf")).logsumexp(-1)
        assert torch.allclose(records.tail, rest, atol=1e-5)
    stats = json.loads((directory / "index.json").read_text())["stats"]
    positions = (len(datamodule.train_examples) + len(datamodule.val_examples)) * 31
    assert stats["scored_positions"] == positions
    assert stats["bytes_per_entry"] <= 6  # 2 (uint16 id) + 2 (fp16) + 4/k (fp32 tail) + headers


def test_a_shard_rewritten_while_a_run_reads_the_cache_stops_it(written, teacher, tmp_path):
    """A cache replaced under a run (``cache ... overwrite=true`` into its directory): the run
    read the new records, written for other settings, unchecked, once the LRU had let the old
    ones go (probe 23: exit 0, trained at another temperature), or died on a missing shard."""
    directory = tmp_path / "cache"
    shutil.copytree(written[0], directory)
    datamodule = written[1]
    cache = TeacherCache.open(directory, expect=expected(teacher, datamodule))
    first = cache.records("train", [0])
    cache._shard.cache_clear()  # as the LRU lets it go once more shards were read
    assert torch.equal(cache.records("train", [0]).ids, first.ids)  # unchanged: read again
    cache._shard.cache_clear()
    shard = directory / "shards" / "train-00000.safetensors"
    replacement = shard.with_suffix(".new")
    shutil.copyfile(shard, replacement)
    os.replace(replacement, shard)  # the same bytes, another file: as a writer replaces it
    with pytest.raises(CacheError, match=rf"{shard} was rewritten or removed while this run"):
        cache.records("train", [0])
    cache._shard.cache_clear()
    shard.unlink()
    with pytest.raises(CacheError, match="Leave a cache in use as it is"):
        cache.records("train", [0])


def test_unpacked_documents_are_stored_padded(teacher, tmp_path: Path) -> None:
    """data.pack=false: one document per block, shorter than block_size; the positions past a
    block's last scored one hold zeros."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": "word " * n}) for n in (3, 5, 9, 2, 7)))
    datamodule = make_datamodule([corpus], pack=False)
    datamodule.setup()
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, tmp_path / "cache")
    cache = TeacherCache.open(tmp_path / "cache", expect=expected(teacher, datamodule))
    for split, examples in (("train", datamodule.train_examples), ("val", datamodule.val_examples)):
        records = cache.records(split, range(len(examples)))
        assert records.ids.shape == (len(examples), 31, SPEC.k)
        for row, example in enumerate(examples):
            scored = len(example) - 1
            with torch.no_grad():
                logits = teacher(input_ids=example[None]).logits[0, :-1]
            assert torch.equal(records.ids[row, :scored], logits.topk(SPEC.k, -1).indices)
            assert not records.ids[row, scored:].any() and not records.tail[row, scored:].any()


def test_every_bad_cache_is_refused_before_training(written, teacher, tmp_path: Path) -> None:
    directory, datamodule = written
    other_tokenizer = byte_tokenizer()
    other_tokenizer.add_tokens(["<extra>"])
    other = {
        "tokenizer": cache_key(teacher, other_tokenizer, datamodule, SPEC.k, 1.0),
        "block_size": expected(teacher, fresh(datamodule, block_size=16)),
        "split": expected(teacher, fresh(datamodule, val_fraction=0.3)),
        "split_seed": expected(teacher, fresh(datamodule, split_seed=1)),
        "k": expected(teacher, datamodule, k=16),
        "temperature": expected(teacher, datamodule, temperature=2.0),
    }
    messages = {
        "tokenizer": "tokenizer: the cache was written for a student reading another tokenizer",
        "block_size": "block_size: the cache has 32, this run 16",
        "split": "data split 'train': the cache holds",
        "split_seed": "data split 'train': the cache holds",
        "k": "k: the cache has 8, this run 16",
        "temperature": "temperature: the cache has 1.0, this run 2.0",
    }
    for case, key in other.items():
        with pytest.raises(CacheMismatch, match="lightning-kd cache") as error:
            TeacherCache.open(directory, expect=key)
        assert messages[case] in str(error.value), (case, str(error.value))
    # another seed orders training alone: the runs of a seed sweep share one cache
    TeacherCache.open(directory, expect=expected(teacher, fresh(datamodule, seed=1)))

    shard = "shards/train-00001.safetensors"
    truncated, flipped = tmp_path / "truncated", tmp_path / "flipped"
    for copy in (truncated, flipped):
        shutil.copytree(directory, copy)
    data = (directory / shard).read_bytes()
    (truncated / shard).write_bytes(data[:-100])
    (flipped / shard).write_bytes(data[:-50] + bytes([data[-50] ^ 1]) + data[-49:])
    with pytest.raises(CacheError, match=f"{truncated / shard} has {len(data) - 100} bytes"):
        TeacherCache.open(truncated, expect=expected(teacher, datamodule))
    with pytest.raises(CacheError, match=f"{flipped / shard} fails its checksum"):
        TeacherCache.open(flipped, expect=expected(teacher, datamodule))
    (flipped / "index.json").unlink()
    with pytest.raises(CacheError, match="writer stopped before finishing"):
        TeacherCache.open(flipped)


def fresh(datamodule, **changes):
    """A set-up copy of the test data module with ``changes`` to its arguments."""
    changed = make_datamodule(datamodule.files, **changes)
    changed.setup()
    return changed


def test_a_directory_holding_another_cache_is_not_written_into(written, teacher) -> None:
    directory, datamodule = written
    with pytest.raises(CacheError, match="k: the cache has 8, this run 4"):
        write_cache(teacher, datamodule.tokenizer, datamodule, CacheSpec(k=4), directory)


KILL_AFTER_TWO_SHARDS = """
import os, signal, sys
import lightning_kd.cache.writer as writer
from lightning_kd.cli import main
original, written = writer.write_shard, []
def write_then_die(*args, **kwargs):
    if len(written) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    written.append(original(*args, **kwargs))
    return written[-1]
writer.write_shard = write_then_die
sys.exit(main(["cache", *sys.argv[1:]]))
"""


@pytest.mark.integration  # runs the command line in a subprocess
def test_a_killed_writer_resumes_with_the_shards_it_completed(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("How vexingly quick daft zebras jump! " * 80)
    overrides = ["debug=smoke", f"data.files=[{corpus}]", "cache.shard_blocks=4"]
    directory = tmp_path / "cache"
    command = [*overrides, f"hydra.run.dir={directory}"]
    killed = subprocess.run(
        [sys.executable, "-c", KILL_AFTER_TWO_SHARDS, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    shards = sorted((directory / "shards").glob("*.safetensors"))
    assert len(shards) == 2 and not (directory / "index.json").exists()
    before = {path.name: (path.stat().st_mtime_ns, path.read_bytes()) for path in shards}

    resumed = subprocess.run(
        [sys.executable, "-m", "lightning_kd", "cache", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "2 kept from an earlier run" in resumed.stdout
    for name, (mtime, data) in before.items():
        path = directory / "shards" / name
        assert path.stat().st_mtime_ns == mtime and path.read_bytes() == data

    # The same cache as one uninterrupted write (in this process).
    write(compose_config(overrides, output_dir=tmp_path / "whole"))
    assert index_shards(directory) == index_shards(tmp_path / "whole")


def index_shards(directory: Path) -> list[dict]:
    return json.loads((directory / "index.json").read_text())["shards"]


@pytest.mark.slow
def test_two_ranks_write_the_cache_one_rank_writes(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Pack my box with five dozen liquor jugs. " * 80)
    overrides = ["debug=smoke", f"data.files=[{corpus}]", "cache.shard_blocks=3"]
    ddp = ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={tmp_path / 'two'}"]
    result = subprocess.run(
        [sys.executable, "-m", "lightning_kd", "cache", *overrides, *ddp],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    write(compose_config(overrides, output_dir=tmp_path / "one"))
    assert index_shards(tmp_path / "two") == index_shards(tmp_path / "one")
    TeacherCache.open(tmp_path / "two")


def test_a_smaller_k_is_derived_from_a_larger_cache(written, teacher, tmp_path: Path) -> None:
    """cache.source: the k = 3 cache narrowed from the k = 8 one is the k = 3 cache the teacher
    writes (the tail to the fp16 rounding of the entries folded into it); k above the source's
    is refused."""
    directory, datamodule = written
    small = CacheSpec(k=3, shard_blocks=SPEC.shard_blocks, batch_size=2)
    narrow_cache(directory, teacher, datamodule.tokenizer, datamodule, small, tmp_path / "narrow")
    write_cache(teacher, datamodule.tokenizer, datamodule, small, tmp_path / "direct")
    key = expected(teacher, datamodule, k=3)
    narrowed = TeacherCache.open(tmp_path / "narrow", expect=key)
    direct = TeacherCache.open(tmp_path / "direct", expect=key)
    blocks = range(len(datamodule.train_examples))
    got, want = narrowed.records("train", blocks), direct.records("train", blocks)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.log_probs, want.log_probs)
    assert torch.equal(got.target, want.target)
    torch.testing.assert_close(got.tail, want.tail, atol=2e-3, rtol=0)
    with pytest.raises(CacheError, match="holds k=8: a cache of cache.k=9 cannot be derived"):
        large = CacheSpec(k=9, shard_blocks=SPEC.shard_blocks)
        narrow_cache(directory, teacher, datamodule.tokenizer, datamodule, large, tmp_path / "x")


def test_hidden_states_are_dropped_from_a_copy_with_the_records_unchanged(
    teacher, tmp_path: Path
) -> None:
    """without_features: the same shards and records, only the teacher modules kept; the copy
    opens against its own key (features a subset) and refuses a run reading a dropped one."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Sphinx of black quartz, judge my vow. " * 60)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    both = ("model.layers.1", "model.layers.3")
    write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, tmp_path / "full", features=both)
    key = without_features(tmp_path / "full", tmp_path / "less", ("model.layers.3",))
    assert key.features == ("model.layers.3",)
    full = TeacherCache.open(tmp_path / "full", expect=expected(teacher, datamodule, features=both))
    less = TeacherCache.open(tmp_path / "less", expect=key)
    blocks = range(len(datamodule.train_examples))
    got, want = less.records("train", blocks), full.records("train", blocks)
    assert set(got.features) == {"model.layers.3"}
    assert torch.equal(got.features["model.layers.3"], want.features["model.layers.3"])
    assert torch.equal(got.ids, want.ids) and torch.equal(got.tail, want.tail)
    with pytest.raises(CacheMismatch, match=r"maps teacher modules \['model.layers.1'\]"):
        TeacherCache.open(tmp_path / "less", expect=expected(teacher, datamodule, features=both))


@pytest.mark.parametrize(
    ("overrides", "stored"),
    [
        ([], ["model.layers.2", "model.layers.3"]),  # the default run's spans, for [0, 3] of 4
        (["distill.features=null"], []),
        (["cache.features=false"], []),
    ],
)
def test_the_cache_stores_the_runs_features_unless_told_not_to(overrides, stored, tmp_path) -> None:
    """cache.features unset follows distill.features: `lightning-kd cache` then
    `python run.py distill.teacher_cache=DIR` works with the default run's feature matching."""
    cfg = compose_config(["debug=smoke", *overrides], output_dir=tmp_path)
    spec = instantiate(cfg.cache, _convert_="all")
    _, features, _ = cached_teacher(cfg, instantiate(cfg.teacher, _convert_="all"), spec)
    assert sorted(features) == stored


def test_a_signal_stops_the_writer_between_shards_and_a_new_run_completes_it(
    tmp_path: Path, teacher, monkeypatch
) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Sphinx of black quartz, judge my vow. " * 60)
    datamodule = make_datamodule([corpus])
    datamodule.setup()
    directory = tmp_path / "cache"
    written_now = []
    write_one = ShardWriter.__call__

    def signal_after_two(self, directory: Path, shard) -> None:
        write_one(self, directory, shard)
        written_now.append(shard)
        if len(written_now) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it

    monkeypatch.setattr(ShardWriter, "__call__", signal_after_two)
    stopped = pytest.raises(Interrupted, match=r"stopped writing the teacher cache \(2 shards kept")
    with STOP.installed(), stopped as error:
        write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    assert error.value.exit_code == 128 + signal.SIGTERM
    assert len(list((directory / "shards").glob("*.safetensors"))) == 2
    assert not (directory / "index.json").exists()

    monkeypatch.undo()
    stats = write_cache(teacher, datamodule.tokenizer, datamodule, SPEC, directory)
    assert stats.shards_kept == 2 and (directory / "index.json").is_file()


def test_a_stopped_writer_of_several_says_its_shards_are_its_own() -> None:
    """Process 0 of 2 said "3 shards kept" of 5 written (probe 35)."""
    from lightning_kd.cache.writer import kept_detail

    assert kept_detail(2, 0, 1) == "2 shards kept; a new run adds the rest"
    assert kept_detail(3, 0, 2).startswith("3 shards kept by process 0 of 2, each keeping its own")


def test_a_training_runs_directory_is_not_offered_as_a_cache(tmp_path: Path) -> None:
    run = tmp_path / "base"
    (run / "checkpoints").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    with pytest.raises(CacheError) as refused:
        read_index(run)
    message = str(refused.value)
    assert f"{run} is a training run's directory (checkpoints, summary.json)" in message
    assert "a directory of its own" in message
    assert f"hydra.run.dir={run}" not in message  # writing there replaces the run's record
    assert set(TRAINING_OUTPUTS) <= set(OUTPUTS)  # the layer below cannot import rundir's list


def test_the_docs_snippet_reads_a_cache(written, teacher) -> None:
    """docs/cache.md's "Reading a cache from Python", run as written on this cache: it unpacked
    four tensors from the six fields of ``Records`` and failed on every cache."""
    directory, datamodule = written
    page = (ROOT / "docs" / "cache.md").read_text()
    snippet = page.split("## Reading a cache from Python")[1].split("```python")[1].split("```")[0]
    snippet = snippet.replace('"caches/smollm2"', repr(str(directory)))
    scope = {"teacher": teacher, "tokenizer": datamodule.tokenizer, "datamodule": datamodule}
    exec(snippet, scope)
    records = scope["records"]
    assert records.ids.shape == (2, 31, 8) and records.tail.shape == (2, 31)
