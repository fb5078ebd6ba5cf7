"""distill.teacher_cache=auto: cached once where the run passes over its blocks often enough."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_kd.cache import TeacherCache
from lightning_kd.cache.format import (
    FORMAT_VERSION,
    INDEX_NAME,
    META_NAME,
    READERS_LOCK,
    WRITER_LOCK,
    CacheKey,
)
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.launch.auto import resolve_teacher_cache
from lightning_kd.launch.build import with_precision, with_values
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.repair_states import drop_repair_states
from lightning_kd.launch.teacher_cache import (
    FOUND,
    MIN_READS_PER_BLOCK,
    CacheChoice,
    choose,
    holds,
    stale,
)
from lightning_kd.launch.teacher_reads import passes, validation_reads
from lightning_kd.utils.locks import WriterLocked
from tests.integration.test_cli import command_here
from tests.unit.utils.test_locks import held_by_another_process, read_by_another_process


def test_the_default_run_caches_its_teacher(tmp_path: Path) -> None:
    cfg = compose_config([], output_dir=tmp_path)
    assert cfg.distill.teacher_cache == "auto"
    assert cfg.data.max_train_examples == 180 and cfg.trainer.max_steps == 80
    assert cfg.distill.blockwise_passes == 5
    assert passes(cfg, 180) == pytest.approx(80 * 2 / 180 * 6)  # a repair pass reads 160 of the 180
    choice = choose(cfg, 180)
    assert choice.caches and choice.path is None  # the shared cache of its key, found at launch
    line = "5.33 passes over 180 training blocks (4.44 of them the block-wise repair's)"
    assert line in choice.line()


def test_a_run_over_its_data_about_once_keeps_the_teacher_online(tmp_path: Path) -> None:
    overrides = ["data.max_train_examples=null", "distill.blockwise_passes=0"]
    cfg = compose_config(overrides, output_dir=tmp_path)
    few = cfg.trainer.max_steps * cfg.data.batch_size / MIN_READS_PER_BLOCK + 1  # just under
    choice = choose(cfg, int(few))
    assert choice.path is None and not choice.caches
    assert f"a cache pays from {MIN_READS_PER_BLOCK}" in choice.reason
    epochs = compose_config(["trainer.max_steps=-1", "trainer.max_epochs=3"], output_dir=tmp_path)
    assert passes(epochs, 10) == 3.0 + 5  # 3 epochs and the default run's 5 repair passes
    # The block-wise repair reads the teacher's states once per pass too: with it, a cache pays.
    overrides = ["data.max_train_examples=null", "distill.blockwise_passes=1"]
    repaired = compose_config(overrides, output_dir=tmp_path)
    assert passes(repaired, int(few)) == pytest.approx(passes(cfg, int(few)) + 1)
    assert choose(repaired, int(few)).caches
    assert "(1.00 of them the block-wise repair's)" in choose(repaired, int(few)).line()
    # A student copied from student.source is repaired against that model, not the teacher: a
    # cache was written for 1.24 passes "of the repair's" that never read it (probe 26).
    sourced = compose_config([*overrides, "student.source=smollm2"], output_dir=tmp_path)
    assert passes(sourced, int(few)) == pytest.approx(passes(cfg, int(few)))
    assert not choose(sourced, int(few)).caches


def test_a_batch_larger_than_the_data_reads_each_block_once_a_batch(tmp_path: Path) -> None:
    overrides = ["debug=smoke", "data.batch_size=100000", "distill.blockwise_passes=0"]
    cfg = compose_config(overrides, output_dir=tmp_path)
    batches = cfg.trainer.max_steps * (cfg.trainer.get("accumulate_grad_batches") or 1)
    assert passes(cfg, 180) == batches  # each batch is the whole 180 blocks, read once
    assert f"auto: {batches:.2f} passes over 180 training blocks" in choose(cfg, 180).reason


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["experiment=ce_only"], "distill.kd_weight=0"),
        (["distill.on_policy=0.5"], "on-policy KD"),
        (["distill.chunked=false"], "distill.chunked=false"),
        (["teacher=minilm"], "only causal LM logits are cached"),
        (["data=chat", "data.files=[c.jsonl]"], "chat data is not cached"),
    ],
)
def test_what_a_cache_cannot_serve_keeps_the_teacher_online(overrides, reason, tmp_path) -> None:
    choice = choose(compose_config(overrides, output_dir=tmp_path), 10)
    assert choice.path is None and not choice.caches
    assert reason in choice.reason
    # CE-only runs no teacher in training at all: the line and the summary say so, not "online".
    ce_only = overrides == ["experiment=ce_only"]
    assert choice.where == ("not run in training" if ce_only else "online")
    assert choice.line().startswith(f"teacher: {choice.where} (auto: ")
    assert choice.as_dict()["in_training"] == choice.where


def test_an_unresolved_auto_built_from_python_is_the_online_teacher() -> None:
    assert DistillConfig(teacher_cache="auto").teacher_cache is None


def cached_smoke(caches: Path) -> list[str]:
    """debug=smoke overrides of a run that auto caches into ``caches``: 3 passes over 8 training
    blocks, and validation reads each of its 22 blocks about twice."""
    return [
        "debug=smoke",
        "data.max_train_examples=8",
        "data.val_fraction=0.002",
        f"cache.dir={caches}",
    ]


def test_several_processes_cache_as_one_does(tmp_path) -> None:
    """They kept the teacher online whatever the config: the same command on 1 and 2 processes
    trained different objectives (the cache's top k against the full teacher). The first to
    take the key's lock writes it with one process, the others find it whole."""
    caches = tmp_path / "caches"
    one = with_precision(compose_config(cached_smoke(caches), output_dir=tmp_path))[0]
    two = with_values(one, {"trainer.devices": 2, "trainer.strategy": "ddp"})
    written, _ = resolve_teacher_cache(two)
    assert written.path is not None and "written to the shared cache" in written.reason
    found, _ = resolve_teacher_cache(two)  # the next process of the launch
    assert found.path == written.path and FOUND in found.reason
    alone, _ = resolve_teacher_cache(one)
    assert alone.path == written.path


@pytest.mark.integration  # runs the command line (in this process)
def test_auto_writes_the_cache_once_trains_from_it_and_a_resume_reuses_it(tmp_path, capsys) -> None:
    run_dir, caches = tmp_path / "run", tmp_path / "caches"
    smoke = cached_smoke(caches)
    # Feature matching too: the cache holds the mapped teacher layers and no teacher runs.
    smoke.append("distill.features=spans")
    first = command_here(capsys, "run", *smoke, f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    cache = Path(summary["teacher_cache"]["distill.teacher_cache"])
    assert cache.parent == caches and summary["teacher_cache"]["written_bytes"] > 0
    assert f"teacher: cached once in {cache} (auto: 3.00 passes" in first.stdout
    assert "written to the shared cache" in first.stdout
    assert summary["teacher_ppl"] > 0 and summary["after"]["val/ppl"] < summary["before"]["val/ppl"]
    assert "| teacher in training |  | cached once |" in first.stdout
    assert summary["written"]["teacher cache"] == {
        "path": str(cache),
        "bytes": sum(p.stat().st_size for p in (cache / "shards").glob("*.safetensors")),
    }
    index = json.loads((cache / "index.json").read_text())
    assert index["key"]["splits"]["train"]["blocks"] == 8
    assert index["key"]["features"] == ["model.layers.2", "model.layers.3"]  # [0, 3] of 4: spans
    assert summary["after"]["val/features"] < summary["before"]["val/features"]

    longer = ["trainer.max_steps=8", "resume_reset_optimizer=true", "ckpt_path=last"]
    resumed = command_here(capsys, "run", *smoke, f"hydra.run.dir={run_dir}", *longer)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        "found whole in the shared cache" in resumed.stdout and "cache rank" not in resumed.stdout
    )
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 8

    # The same command into another directory: the same cache, nothing written to it.
    again = command_here(capsys, "run", *smoke, f"hydra.run.dir={tmp_path / 'again'}")
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert second["teacher_cache"]["distill.teacher_cache"] == str(cache)
    assert second["teacher_cache"]["written_bytes"] == 0
    assert len(list(caches.iterdir())) == 2  # the one cache and its lock file
    assert second["after"] == summary["after"]


def test_a_cache_missing_what_a_run_reads_is_written_anew_and_kept_when_asked(tmp_path) -> None:
    """The shared directory of a key whose repair states were dropped: a run that repairs finds
    it lacking (written again from the start); a resume, reading none, finds it whole. The drop
    touches only a cache this run wrote, and nothing with cache.keep_repair_states=true."""
    directory, (full, less) = tmp_path / "c", (keys(("a", "b")), keys(("a",)))
    assert not holds(directory, full) and not stale(directory, full)  # nothing there yet
    (directory / "shards").mkdir(parents=True)
    (directory / META_NAME).write_text(json.dumps({"key": less.as_dict()}))
    (directory / INDEX_NAME).write_text(
        json.dumps({"format": FORMAT_VERSION, "key": less.as_dict(), "shards": []})
    )
    assert holds(directory, less) and not holds(directory, full) and stale(directory, full)
    written = CacheChoice(str(directory), "auto", caches=True, written_bytes=10)
    assert drop_repair_states(written, {"a"}, keep=True) is written
    found = CacheChoice(str(directory), "auto", caches=True, written_bytes=0)
    assert drop_repair_states(found, set(), keep=False) is found  # another run's cache


def test_a_cache_removed_under_a_finished_run_does_not_fail_it(tmp_path) -> None:
    """rm -rf of the cache while the run trained from it: the run trained to its end, then
    failed in this optional step, exit 2, no summary, advising overwrite=true (probe 48)."""
    gone = CacheChoice(str(tmp_path / "gone" / "key"), "auto", caches=True, written_bytes=10)
    with pytest.warns(UserWarning, match=r"could not be narrowed after the run"):
        kept = drop_repair_states(gone, {"a"}, keep=False)
    assert kept.reason.endswith("not dropped: the cache was gone or damaged")
    assert kept.path == gone.path and kept.written_bytes == 10


def test_the_repair_states_stay_while_another_run_reads_the_cache(tmp_path) -> None:
    """Two auto runs of one key: the first to end dropped the repair's states from under the
    second, which died with a KeyError in its repair (probe 23)."""
    directory, full = tmp_path / "c", keys(("a", "b"))
    (directory / "shards").mkdir(parents=True)
    index = {"format": FORMAT_VERSION, "key": full.as_dict(), "shards": []}
    (directory / INDEX_NAME).write_text(json.dumps(index))
    written = CacheChoice(str(directory), "auto", caches=True, written_bytes=10)
    with read_by_another_process(directory / READERS_LOCK):
        kept = drop_repair_states(written, {"a"}, keep=False)
    assert kept.reason.endswith("the repair's own hidden states kept: another run reads the cache")
    assert json.loads((directory / INDEX_NAME).read_text())["key"]["features"] == ["a", "b"]


def keys(features: tuple[str, ...]) -> CacheKey:
    split = {"blocks": 2, "digest": "d"}
    return CacheKey(
        "w", "c", "float32", "t", 64, True, 8, 1.0, {"train": split, "val": split}, features
    )


def test_auto_takes_the_shared_caches_writer_lock_inside_its_own(tmp_path) -> None:
    """auto's file lock (beside the cache, held while it looks and writes) and the writer lock
    (inside it) are two files: auto writes under both, no deadlock; and while another writer
    (`lightning-kd cache` into that directory) holds the cache, auto is refused, its pid named."""
    caches = tmp_path / "caches"
    smoke = cached_smoke(caches)
    cfg = compose_config(smoke, output_dir=tmp_path / "run")
    first, _ = resolve_teacher_cache(cfg)
    directory = Path(first.path)
    assert first.written_bytes > 0 and directory.parent == caches
    (directory / INDEX_NAME).unlink()  # as a writer stopped before finishing leaves it
    with (
        held_by_another_process(directory / WRITER_LOCK) as holder,
        pytest.raises(WriterLocked, match=rf"{directory} is .* \(pid {holder.pid}, "),
    ):
        resolve_teacher_cache(cfg)
    again, _ = resolve_teacher_cache(cfg)
    assert again.path == first.path and "written to the shared cache" in again.reason
    assert (directory / INDEX_NAME).is_file()


def test_a_damaged_shard_of_the_shared_cache_is_rewritten_by_the_next_run(tmp_path) -> None:
    """It was "found whole", then refused with advice to run a writer on the shared directory,
    which auto users never ran; the same run failed the same way again (probe 23)."""
    caches = tmp_path / "caches"
    smoke = cached_smoke(caches)
    cfg = compose_config(smoke, output_dir=tmp_path / "run")
    first, _ = resolve_teacher_cache(cfg)
    directory = Path(first.path)
    shard = sorted((directory / "shards").glob("train-*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again, _ = resolve_teacher_cache(cfg)
    assert "written to the shared cache" in again.reason and "found whole" not in again.reason
    assert 0 < again.written_bytes < first.written_bytes  # that shard alone
    TeacherCache.open(directory)  # every shard whole again
    third, _ = resolve_teacher_cache(cfg)
    assert "found whole in the shared cache" in third.reason


@pytest.mark.parametrize("record", ["meta.json", "index.json"])
def test_a_damaged_record_of_the_shared_cache_is_written_anew(tmp_path, record) -> None:
    """A meta.json cut short (with its index gone, as a writer killed before it leaves) was a
    JSONDecodeError traceback naming no file, in every later run of the key (probe 59)."""
    caches = tmp_path / "caches"
    cfg = compose_config(cached_smoke(caches), output_dir=tmp_path / "run")
    directory = Path(resolve_teacher_cache(cfg)[0].path)
    (directory / record).write_bytes((directory / record).read_bytes()[:100])
    if record == "meta.json":
        (directory / "index.json").unlink()
    again, _ = resolve_teacher_cache(cfg)
    assert "written to the shared cache" in again.reason
    TeacherCache.open(directory)  # whole again
    assert "found whole in the shared cache" in resolve_teacher_cache(cfg)[0].reason


def test_a_repair_the_data_cannot_batch_is_refused_before_auto_writes(tmp_path) -> None:
    """It was refused by the repair's sampler once auto had written a 43 MB cache for the run
    that could not start."""
    caches = tmp_path / "caches"
    smoke = ["debug=smoke", "distill.blockwise_passes=1", "data.max_train_examples=2"]
    smoke.append("data.val_fraction=0.002")  # validation's blocks read about twice each
    cfg = compose_config([*smoke, f"cache.dir={caches}"], output_dir=tmp_path / "run")
    # (one process: the epoch's check, which names data.batch_size, finds it first)
    with pytest.raises(ValueError, match="data.batch_size=4 but an epoch holds 2 training exam"):
        resolve_teacher_cache(cfg)
    assert not caches.exists()


def test_validation_blocks_count_as_written_and_as_often_as_read(tmp_path: Path) -> None:
    """auto weighed training passes alone: debug=smoke over 12 training blocks cached its 541
    validation blocks too, for a run reading 48 of them (11.5x the teacher forwards; probe 26)."""
    smoke = compose_config(["debug=smoke", "data.max_train_examples=12"], output_dir=tmp_path)
    assert validation_reads(smoke, 541, 12) == 3 * 2 * 8  # before, at steps 3 and 6: 2 batches of 8
    choice = choose(smoke, 12, 541)
    assert not choice.caches
    assert choice.reason == (
        "auto: 2.00 passes over 12 training blocks; 72 teacher reads (48 validation's) of the "
        "blocks a cache holds (12 training, 541 validation): 0.13 a block; a cache pays from 1.5"
    )
    assert choose(smoke, 12, 20).caches  # (24 + 48) reads of 32 blocks
    whole = compose_config([], output_dir=tmp_path)  # the default run: every block, 2 times
    assert validation_reads(whole, 32, 180) == 2 * 32
    # An epoch-bounded run validates every val_check_interval steps of its epochs (it was
    # counted once, probe 27); data.val_batch_size=null is data.batch_size's.
    epochs = ["trainer.max_steps=-1", "trainer.max_epochs=2", "trainer.val_check_interval=3"]
    by_epoch = compose_config(["debug=smoke", *epochs, "data.val_batch_size=null"])
    assert validation_reads(by_epoch, 541, 12) == (1 + 2) * 2 * 4  # 6 steps of 4 blocks
    fraction = compose_config([*epochs[:2], "trainer.val_check_interval=0.5"])
    assert validation_reads(fraction, 32, 180) == (1 + 4) * 32  # 2 an epoch of 90 steps
    # A teacher of 10 % of the blocks (its data domains) reads 10 % of what the run reads.
    assert choose(smoke, 12, 20).caches and not choose(smoke, 12, 20, (0.1, 0.1)).caches
    assert ", 10% of them its domains'" in choose(smoke, 12, 20, (0.1, 0.1)).reason


def test_every_process_of_the_run_reads_its_own_batches() -> None:
    """auto counted one process's reads: 2 processes at 80 steps read 1.72 times a block, and
    the run kept its teacher online on 0.91 (probe 35)."""
    from lightning_kd.launch.teacher_reads import epoch_batches, processes

    smoke = ["debug=smoke", "trainer.max_steps=80", "trainer.accumulate_grad_batches=2"]
    smoke += ["validate_before=false", "trainer.val_check_interval=1000"]  # the probe's run
    one, two = compose_config(smoke), compose_config([*smoke, "trainer.devices=2"])
    assert (processes(one), processes(two)) == (1, 2)
    assert processes(compose_config([*smoke, "trainer.devices=3", "trainer.num_nodes=2"])) == 6
    assert processes(compose_config([*smoke, "trainer.devices='0,1'"])) == 2
    assert passes(two, 180) == 2 * passes(one, 180) == 2 * 80 * 2 * 4 / 180
    assert not choose(one, 180, 541).caches and choose(two, 180, 541).caches
    assert validation_reads(two, 541, 180) == 2 * validation_reads(one, 541, 180)  # limit: 2/rank
    epochs = ["trainer.max_steps=-1", "trainer.max_epochs=1"]
    per_rank = compose_config(["debug=smoke", *epochs, "trainer.devices=2"])
    assert epoch_batches(per_rank, 180) == 23  # each process: its half, 90 blocks, in 4s
    assert passes(per_rank, 180) == 1.0


def test_an_epoch_bounded_run_counts_the_batches_it_is_limited_to() -> None:
    """trainer.limit_train_batches was left out of an epoch-bounded run's passes: 2 epochs of
    10 batches counted 2.00 passes and cached, where 20 steps counted 0.22 (probe 30)."""
    no_repair = ["trainer.max_steps=-1", "trainer.max_epochs=2", "distill.blockwise_passes=0"]
    limited = compose_config([*no_repair, "trainer.limit_train_batches=10"])
    steps = compose_config(["trainer.max_steps=20", "distill.blockwise_passes=0"])
    assert passes(limited, 180) == passes(steps, 180) == pytest.approx(20 * 2 / 180)
    half = compose_config([*no_repair, "trainer.limit_train_batches=0.5"])  # 45 of 90 batches
    assert passes(half, 180) == pytest.approx(2 * 45 * 2 / 180)
    assert passes(compose_config(no_repair), 180) == 2.0


def test_an_entry_of_some_domains_reads_their_share_of_each_split() -> None:
    from types import SimpleNamespace

    from lightning_kd.data.domains import Domains
    from lightning_kd.launch.auto import domain_shares

    data = SimpleNamespace(
        domains=Domains(("code", "prose"), {}), train_domains=[0, 1, 1, 1], val_domains=[0, 0]
    )
    assert domain_shares(["prose"], data) == (0.75, 0.0)
    assert domain_shares(None, data) == (1.0, 1.0)
    assert domain_shares(["code"], SimpleNamespace(domains=None)) == (1.0, 1.0)


def test_the_choice_reads_the_config_not_what_the_shared_directory_holds(tmp_path) -> None:
    """The same command trains the same objective on any machine: a run a cache would not pay
    for keeps its teacher online beside a whole cache of its key (give distill.teacher_cache=DIR
    to read that one), and writes none."""
    caches = tmp_path / "caches"
    once = ["trainer.max_steps=1", "trainer.limit_val_batches=1"]  # under MIN_READS_PER_BLOCK reads
    few = with_precision(compose_config([*cached_smoke(caches), *once], output_dir=tmp_path))[0]
    alone, _ = resolve_teacher_cache(few)
    assert alone.path is None and "a cache pays from" in alone.reason
    assert not list(caches.glob("*/index.json"))  # nothing written for it
    many = with_precision(compose_config(cached_smoke(caches), output_dir=tmp_path))[0]
    assert resolve_teacher_cache(many)[0].path is not None
    beside, _ = resolve_teacher_cache(few)
    assert beside.path is None and beside.reason == alone.reason


def test_the_line_the_commands_page_quotes_is_the_default_runs() -> None:
    """docs/commands.md quoted auto's line from before it counted the validations' reads."""
    page = (Path(__file__).parents[3] / "docs" / "commands.md").read_text()
    (line,) = [line for line in page.splitlines() if line.startswith("teacher: cached once in")]
    reason = choose(compose_config([]), 180, 32).reason  # the default run's blocks
    assert line.endswith(f"({reason}; written to the shared cache)")
