"""The training clock behind the summary's tokens/s, and the throughput logged on it."""

from __future__ import annotations

from lightning.pytorch import Callback

from lightning_kd.training import summary
from lightning_kd.training.summary import RunSummary, TrainTimer
from tests.conftest import make_datamodule, make_module, make_trainer


class Clock:
    """A stand-in for ``time.perf_counter`` that moves only when told."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class Takes(Callback):
    """Each training batch takes ``train`` seconds, each validation batch ``validation``."""

    def __init__(self, clock: Clock, train: float, validation: float) -> None:
        self.clock, self.train, self.validation = clock, train, validation

    def on_train_batch_end(self, *args) -> None:
        self.clock.now += self.train

    def on_validation_batch_end(self, *args) -> None:
        self.clock.now += self.validation


class LoggedThroughput(Callback):
    """What the timer logged at each training batch's end (the callbacks after it see it)."""

    def __init__(self) -> None:
        self.rates: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, *args) -> None:
        self.rates.append(
            {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("through")}
        )


def test_training_seconds_leave_out_validation_and_throughput_is_logged(
    tiny_teacher, corpus, monkeypatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(summary, "time", clock)
    timer, logged = TrainTimer(window=2), LoggedThroughput()
    trainer = make_trainer(
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=1,
        # Before the timer: its batch-end hook sees the batch's time gone by.
        callbacks=[Takes(clock, train=0.5, validation=100.0), timer, logged],
    )
    trainer.fit(make_module(tiny_teacher), make_datamodule([corpus]))
    assert timer.seconds == 4 * 0.5  # the two validations are not training time

    # Rates once the window (2 batches) is full: Lightning's Throughput on the timer's clock.
    assert logged.rates[0] == {}
    assert logged.rates[-1] == {
        "throughput/device/batches_per_sec": 2.0,
        "throughput/device/samples_per_sec": 2.0 * 4,  # batches of 4 full 32-token blocks
        "throughput/device/tokens_per_sec": 2.0 * 4 * 32,
    }


def test_summary_tokens_per_second() -> None:
    run = RunSummary(after={}, train_tokens=600, train_seconds=2.0)
    assert run.tokens_per_second == 300.0
    assert RunSummary(after={}).tokens_per_second is None  # nothing trained: no rate
    assert "| tokens/s (training) |  | — |" in RunSummary(after={}).markdown()


def test_a_resumed_run_rates_only_the_tokens_it_trained() -> None:
    """A resume's token count starts at the checkpoint's; its seconds are its own."""
    resumed = RunSummary(after={}, train_tokens=6000, train_seconds=2.0, timed_tokens=600)
    assert resumed.tokens_per_second == 300.0
    finished = RunSummary(after={}, train_tokens=6000, train_seconds=0.0, timed_tokens=0)
    assert finished.tokens_per_second is None


def test_each_teachers_cache_is_reported_and_counted_as_written(tmp_path) -> None:
    def choice(path: str, size: int) -> dict:
        return {"distill.teacher_cache": path, "in_training": "cached once", "written_bytes": size}

    entries = {"gemma": choice("caches/b", 3 * 2**20), "read": choice("caches/c", 0)}
    written = summary.disk_use(tmp_path, choice("caches/a", 2**20), entries)
    assert written["teacher cache"] == {"path": "caches/a", "bytes": 2**20}
    assert written["teacher cache (gemma)"] == {"path": "caches/b", "bytes": 3 * 2**20}
    # Only read (given whole, or found whole by a resume): it said "written: 0.0 MB".
    assert "teacher cache (read)" not in written
    report = RunSummary(
        after={},
        before={},
        teacher_ppl=None,
        steps=1,
        train_tokens=1,
        train_seconds=1.0,
        wall_seconds=1.0,
        entry_caches=entries,
        written=written,
    ).markdown()
    assert "| teachers[gemma] in training |  | cached once |" in report
    assert "| written: teacher cache (gemma) |  | 3.0 MB in caches/b |" in report


def test_a_teachers_entry_of_its_own_dtype_is_in_the_precision_row() -> None:
    """An entry in bfloat16 beside a float32 teacher: the row named the main teacher's alone."""
    from lightning_kd.distill.teacher_entries import teacher_entries
    from lightning_kd.launch.config import compose_config
    from lightning_kd.launch.teacher_list import held_precisions
    from lightning_kd.models.loading import TeacherSpec
    from tests.conftest import TINY_LLAMA

    def layers(count: int) -> dict:
        return {**TINY_LLAMA, "num_hidden_layers": count}

    cfg = compose_config(["debug=smoke", "teacher.dtype=float32"])
    listed = [
        {"name": "main", "weight": 0.4},
        {"name": "b", "weight": 0.3, "dtype": "bfloat16", "config": layers(3)},
        {"name": "c", "weight": 0.3, "dtype": "float32", "config": layers(2)},  # as the teacher
    ]
    entries = teacher_entries(listed, TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    precision = {"trainer.precision": "32-true", "teacher.dtype": "float32"}
    precision |= held_precisions(cfg, entries)
    assert precision["dtype[b]"] == "bfloat16" and "dtype[c]" not in precision
    row = RunSummary({}, precision=precision).markdown().split("| precision |  | ")[1]
    assert row.split(" |")[0] == "32-true, teacher float32, teachers[b] bfloat16"
    cfg = compose_config(["debug=smoke", "teacher.dtype=float32", "student.dtype=bfloat16"])
    precision |= held_precisions(cfg, None)  # the row said 32-true of a bf16 student (probe 55)
    row = RunSummary({}, precision=precision).markdown().split("| precision |  | ")[1]
    assert row.split(" |")[0] == "32-true, student bfloat16, teacher float32, teachers[b] bfloat16"


def test_the_run_directory_written_counts_what_the_run_wrote(tmp_path) -> None:
    """Measured before the set-aside outputs are removed, an overwriting run reported the run it
    replaced as written too (2.6 MB for 1.3; probe 26), and files it found there (a user's
    notes, a cache written into the directory) as its own (probe 27)."""
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "train.log").write_bytes(b"x" * 10)
    (tmp_path / ".overwritten" / "student").mkdir(parents=True)
    (tmp_path / ".overwritten" / "student" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "notes.bin").write_bytes(b"x" * 1000)
    written = summary.disk_use(tmp_path)
    assert written["run directory"]["bytes"] == 110 and written["student"]["bytes"] == 100


def test_a_kept_checkpoint_linked_to_last_is_counted_once(tmp_path) -> None:
    """checkpoint.keep's step-<N>.ckpt and best.ckpt are hard links to last.ckpt: summed per
    name, one 1 MB checkpoint read as 3 MB written."""
    import os

    (tmp_path / "checkpoints").mkdir()
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.write_bytes(b"x" * 1000)
    os.link(last, tmp_path / "checkpoints" / "step-4.ckpt")
    os.link(last, tmp_path / "checkpoints" / "best.ckpt")
    (tmp_path / "checkpoints" / "step-2.ckpt").write_bytes(b"x" * 1000)
    written = summary.disk_use(tmp_path)
    assert written["checkpoints"]["bytes"] == 2000 and written["run directory"]["bytes"] == 2000


def test_several_teachers_agreement_and_kl_are_shown_per_teacher_by_name() -> None:
    """The unsuffixed rows were the main teacher's alone, unlabelled: a student three times as
    far from the second teacher read as unchanged (probe 26)."""
    before = {"val/kl": 0.005, "val/kl/sp": 0.005, "val/kl/bytes": 0.0013, "val/ppl": 9.0}
    after = {"val/kl": 0.005, "val/kl/sp": 0.005, "val/kl/bytes": 0.0039, "val/ppl": 8.0}
    report = RunSummary(
        after=after,
        before=before,
        teacher_ppl=14.5,
        steps=1,
        train_tokens=1,
        train_seconds=1.0,
        wall_seconds=1.0,
    ).markdown()
    assert "| teacher perplexity (val) of the teacher group's model | 14.50 |" in report
    assert "| KL(teachers[bytes] ‖ student) per token | 0.001 | 0.004 |" in report
    assert "| KL(teachers[sp] ‖ student) per token | 0.005 | 0.005 |" in report
    assert "| KL(teacher ‖ student) per token |" not in report
    one = RunSummary(after={"val/kl": 0.1}, steps=1, train_tokens=1, train_seconds=1.0).markdown()
    assert "| KL(teacher ‖ student) per token |" in one


def test_a_teacher_of_another_tokenizer_is_shown_by_bits_per_byte_and_aligned_share() -> None:
    """A cross-tokenizer run logged val/teacher_bpb and val/aligned, and its summary showed
    neither: no teacher figure at all, since that teacher has no perplexity of the student's
    tokens (probe 32)."""
    before = {"val/bpb": 3.5, "val/teacher_bpb": 0.981, "val/aligned": 0.911}
    after = {"val/bpb": 3.1, "val/teacher_bpb": 0.981, "val/aligned": 0.911}
    report = RunSummary(
        after=after, before=before, steps=1, train_tokens=1, train_seconds=1.0
    ).markdown()
    assert "| teacher bits per byte (val) | 0.9810 |  |" in report
    assert "| student positions aligned with the teacher (val) | 0.911 | 0.911 |" in report
    assert "perplexity (val)" not in report  # the student's tokens only: none was logged
    two = {"val/aligned/gemma": 0.9, "val/kl/gemma": 0.3, "val/kl/smol": 0.1, "val/kl": 0.1}
    report = RunSummary(after=two, steps=1, train_tokens=1, train_seconds=1.0).markdown()
    assert "| student positions aligned with teachers[gemma] (val) | — | 0.900 |" in report


def test_a_resume_that_reuses_its_final_validation_keeps_the_teachers_perplexity() -> None:
    """Stopped during the export and resumed, the run validated nothing and its summary had
    "teacher_ppl": null and no teacher row, though the reused validation held it (probe 33)."""
    after = {"val/ppl": 58.0, "val/teacher_ppl": 14.539}
    summary = RunSummary(after=after, steps=6, train_tokens=1, train_seconds=0.0)
    assert summary.as_dict()["teacher_ppl"] == 14.539
    assert "| teacher perplexity (val) | 14.54 |" in summary.markdown()


def test_a_cached_runs_kl_is_labelled_as_the_bound_it_is() -> None:
    """From a teacher cache, val/kl is the bucketed KL over the top k: it read 0.006 under the
    online KL's label where the online KL was 0.514 (probe 45)."""
    after = {"val/kl": 0.006}
    online = RunSummary(after=after).markdown()
    choice = {"distill.teacher_cache": "/c/teacher_caches/k", "in_training": "cached once"}
    cached = RunSummary(after=after, teacher_cache=choice).markdown()
    assert "| KL(teacher ‖ student) per token | — | 0.006 |" in online
    assert "per token, over the cache's top k and the rest in one (a lower bound) |" in cached
    # auto chose the teacher online: its KL is the full one, labelled so (probe 48)
    auto = {"distill.teacher_cache": None, "in_training": "online", "reason": "auto: 0.55 a block"}
    assert (
        "| KL(teacher ‖ student) per token | — | 0.006 |"
        in RunSummary(after=after, teacher_cache=auto).markdown()
    )


def test_each_cached_teachers_kl_among_several_is_labelled_as_the_bound_it_is() -> None:
    """With several teachers the per-teacher rows kept the online KL's label: a cached one's
    bucketed KL read 0.001 where its online KL was 0.008 (probe 55)."""
    after = {"val/kl": 0.001, "val/kl/tiny": 0.001, "val/kl/b2": 0.003, "val/kl/c": 0.02}
    main = {"distill.teacher_cache": "/c/k", "in_training": "cached once", "name": "tiny"}
    entries = {
        "b2": {"distill.teacher_cache": "/c/b", "in_training": "cached once"},
        "c": {"distill.teacher_cache": None, "in_training": "online"},
    }
    report = RunSummary(after=after, teacher_cache=main, entry_caches=entries).markdown()
    bound = "per token, over its cache's top k and the rest in one (a lower bound) | — |"
    for name in ("tiny", "b2"):
        assert f"| KL(teachers[{name}] ‖ student) {bound}" in report
    assert "| KL(teachers[c] ‖ student) per token | — | 0.020 |" in report  # online
    online = RunSummary(after=after, entry_caches=entries).markdown()  # the main one online
    assert "| KL(teachers[tiny] ‖ student) per token | — | 0.001 |" in online


def test_a_student_ending_worse_than_it_started_is_said() -> None:
    """optimizer.lr=50: val/ppl 241 → 321,939, exit 0, and nothing said (probe 47)."""
    diverged = RunSummary(before={"val/ppl": 241.0}, after={"val/ppl": 321939.0})
    assert diverged.as_dict()["worse"].startswith("val/ppl rose over the run, 241 → 3.219e+05")
    assert "| worse than before training |  | val/ppl rose over the run" in diverged.markdown()
    learnt = RunSummary(before={"val/ppl": 241.0}, after={"val/ppl": 90.0})
    assert learnt.as_dict()["worse"] is None and "worse than" not in learnt.markdown()
    assert RunSummary(after={"val/ppl": 90.0}).worse is None  # nothing validated before


def test_a_resumed_runs_time_and_rate_are_said_to_be_the_last_launchs() -> None:
    """A run resumed 8 times showed its last launch's 35.8 s and 909 tokens/s as the whole
    run's (probe 47)."""
    resumed = RunSummary(after={}, train_tokens=75600, timed_tokens=25200, train_seconds=27.7)
    text = resumed.markdown()
    assert "| tokens/s (training, this launch) |  | 910 |" in text
    assert "| wall time (s, this launch) |" in text
    whole = RunSummary(after={}, train_tokens=600, timed_tokens=600, train_seconds=2.0)
    assert "| tokens/s (training) |" in whole.markdown()
