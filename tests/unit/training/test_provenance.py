"""Checkpoints record the teacher, tokenizer, objective, data and optimizer; a resume with others
is refused (the optimizer's applied on purpose with resume_reset_optimizer=true)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.differences import differences
from lightning_kd.training.optim import warmup_cosine
from lightning_kd.training.provenance import KEY, Provenance, ProvenanceMismatch, record
from lightning_kd.training.saving import LastCheckpoint
from lightning_kd.training.step_record import compute_changes
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer


def fit(
    tmp_path: Path,
    teacher: TeacherSpec,
    corpus: Path,
    ckpt: Path | None,
    mode: str = "error",
    data: dict | None = None,
    optimizer: Callable | None = None,
    schedule: Callable | None = None,
    reset: bool = False,
    probe: Callback | None = None,
    teachers: list | None = None,
    trainer: dict | None = None,
    student: dict | None = None,
    **distill,
) -> Path:
    module = make_module(teacher, student, teachers=teachers, **distill)
    if optimizer is not None:
        module.optimizer_factory = optimizer
    module.scheduler_factory = schedule
    callbacks = [LastCheckpoint(str(tmp_path / "checkpoints"), every=1), Provenance(mode, reset)]
    trainer = make_trainer(
        max_steps=4 if ckpt else 2,
        enable_checkpointing=True,
        callbacks=[*callbacks, *([probe] if probe else [])],
        **(trainer or {}),
    )
    trainer.fit(module, make_datamodule([corpus], **(data or {})), ckpt_path=ckpt)
    return tmp_path / "checkpoints" / "last.ckpt"


def test_a_resume_with_another_teacher_or_objective_is_refused(
    tmp_path: Path, corpus: Path
) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None)
    reseeded = TeacherSpec(path=None, config=dict(TINY_LLAMA), init_seed=1)
    with pytest.raises(ProvenanceMismatch) as error:
        fit(tmp_path, reseeded, corpus, checkpoint)
    assert "teacher.init_seed: checkpoint 0, this run 1" in str(error.value)
    assert "teacher.weights: checkpoint '" in str(error.value)
    assert "resume_mismatch=warn" in str(error.value)
    with pytest.raises(
        ProvenanceMismatch, match=r"distill\.temperature: checkpoint 1\.0, this run"
    ):
        fit(tmp_path, teacher, corpus, checkpoint, temperature=2.0)
    with pytest.warns(UserWarning, match="resume_mismatch=warn: continuing"):
        fit(tmp_path, teacher, corpus, checkpoint, "warn", temperature=2.0)
    # a repair added on resume never runs (it runs before the first step): refused, named
    with pytest.raises(ProvenanceMismatch, match=r"distill\.blockwise_passes: checkpoint 0, this"):
        fit(tmp_path, teacher, corpus, checkpoint, blockwise_passes=2)


def test_a_resume_with_other_teachers_is_refused_naming_each_change(tmp_path, corpus) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32")

    def teachers(weight: float = 0.4, seed: int = 1, name: str = "second") -> list[dict]:
        own = {"config": dict(TINY_LLAMA), "init_seed": seed}
        return [{"name": "main", "weight": 1 - weight}, {"name": name, "weight": weight, **own}]

    checkpoint = fit(tmp_path, teacher, corpus, None, teachers=teachers())
    changes = {
        "a weight": (
            teachers(weight=0.5),
            ["teachers.second.weight: checkpoint 0.4, this run 0.5"],
        ),
        "another model": (
            teachers(seed=2),
            ["teachers.second.init_seed: checkpoint 1, this run 2", "teachers.second.weights:"],
        ),
        "a teacher renamed": (
            teachers(name="third"),
            [
                "teachers.second: a teacher of the checkpoint, not of this run",
                "teachers.third: not in the checkpoint, a teacher of this run",
            ],
        ),
        "a teacher dropped": (None, ["teachers.second: a teacher of the checkpoint, not of this"]),
    }
    for why, (listed, named) in changes.items():
        with pytest.raises(ProvenanceMismatch) as error:
            fit(tmp_path, teacher, corpus, checkpoint, teachers=listed)
        for line in named:
            assert line in str(error.value), (why, str(error.value))


def test_a_lora_resume_onto_another_base_student_is_refused(tmp_path: Path, corpus: Path) -> None:
    """The base is rebuilt, not read from the checkpoint: adapters trained on layers [0, 3] must
    not silently continue on a student copied from layers [1, 3] (same shapes, other weights)."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    lora = {"r": 2, "alpha": 4}
    checkpoint = fit(tmp_path, teacher, corpus, None, student={"layers": [0, 3], "lora": lora})
    with pytest.raises(ProvenanceMismatch, match=r"student\.base: checkpoint '"):
        fit(tmp_path, teacher, corpus, checkpoint, student={"layers": [1, 3], "lora": lora})


def test_a_resume_that_trains_other_student_parameters_is_refused_unless_reset(
    tmp_path: Path, corpus: Path
) -> None:
    """Another set of trained parameters is another optimizer: its saved state did not load
    (torch's ValueError about a parameter group's size, a traceback after the restore began).
    resume_reset_optimizer=true changes the trained set on purpose."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None)
    for student, line in (
        ({"freeze_layers": 1}, "student.freeze_layers: checkpoint 0, this run 1"),
        (
            {"freeze_embeddings": False},
            "student.freeze_embeddings: checkpoint True, this run False",
        ),
    ):
        with pytest.raises(ProvenanceMismatch) as error:
            fit(tmp_path / "again", teacher, corpus, checkpoint, "warn", student=student)
        assert line in str(error.value) and "resume_reset_optimizer=true" in str(error.value)
    fit(tmp_path / "reset", teacher, corpus, checkpoint, reset=True, student={"freeze_layers": 1})
    older = {"teacher": {}, "student": {"base": "abc"}}  # saved before the trained set was
    assert differences(older, {"teacher": {}, "student": {"base": "abc", "freeze_layers": 1}}) == []


def test_an_older_checkpoint_is_judged_by_its_optimizer_state(tmp_path: Path, corpus: Path):
    """A checkpoint saved before the record named the trained set (or with no record at all):
    another set is found by the count of tensors its optimizer holds."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None)
    state = torch.load(checkpoint, weights_only=False)
    del state["provenance"]["student"]
    older = tmp_path / "older.ckpt"
    torch.save(state, older)
    del state["provenance"]
    oldest = tmp_path / "oldest.ckpt"
    torch.save(state, oldest)
    for saved in (older, oldest):
        with pytest.raises(ProvenanceMismatch, match=r"optimizer holds the state of \d+ param"):
            fit(tmp_path / "again", teacher, corpus, saved, student={"freeze_layers": 1})
    fit(tmp_path / "same", teacher, corpus, older)  # the same set goes on
    fit(tmp_path / "reset", teacher, corpus, older, reset=True, student={"freeze_layers": 1})


def test_a_resume_with_other_data_is_refused_naming_what_changed(
    tmp_path: Path, corpus: Path
) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None)
    cases = {
        "data.block_size: checkpoint 32, this run 16": {"block_size": 16},
        "data.seed: checkpoint 0, this run 1": {"seed": 1},
        "data.split_seed: checkpoint 0, this run 2": {"split_seed": 2},
        "data.val_fraction: checkpoint 0.2, this run 0.3": {"val_fraction": 0.3},
        "data.batch_size: checkpoint 4, this run 2": {"batch_size": 2},
    }
    for expected, data in cases.items():
        with pytest.raises(ProvenanceMismatch, match=re.escape(expected)):
            fit(tmp_path, teacher, corpus, checkpoint, data=data)
    edited = corpus.read_text().replace("the", "a")
    corpus.write_text(edited)  # the same file, edited
    with pytest.raises(
        ProvenanceMismatch, match=rf"data\.files: edited \['{re.escape(str(corpus))}'\]"
    ):
        fit(tmp_path, teacher, corpus, checkpoint)
    with pytest.warns(UserWarning, match="resume_mismatch=warn: continuing"):
        fit(tmp_path, teacher, corpus, checkpoint, "warn")


def test_a_checkpoint_from_before_split_seed_is_compared_by_the_seed_that_drew_its_split():
    """Before ``data.split_seed``, ``data.seed`` drew the split: a checkpoint of ``seed=1``
    resumed by default (split seed 0) holds out other text, and is named so."""
    older = {"data": {"seed": 1}}
    assert differences(older, {"data": {"seed": 1, "split_seed": 0}}) == [
        "data.split_seed: checkpoint 1, this run 0"
    ]
    assert differences(older, {"data": {"seed": 1, "split_seed": 1}}) == []


def test_an_on_policy_resume_with_other_draws_is_refused() -> None:
    """Another on_policy_seed or on_policy_warmup samples other micro-batches: a resume with
    either trained another student without a word (probe 44)."""
    module = make_module(
        TeacherSpec(path=None, config=dict(TINY_LLAMA)),
        on_policy=0.5,
        on_policy_seed=3,
        on_policy_warmup=2,
    )
    saved = record(module)
    assert saved["distill"]["on_policy_seed"] == 3 and saved["distill"]["on_policy_warmup"] == 2
    now = saved | {"distill": saved["distill"] | {"on_policy_seed": 7, "on_policy_warmup": 5}}
    assert differences(saved, now) == [
        "distill.on_policy_seed: checkpoint 3, this run 7",
        "distill.on_policy_warmup: checkpoint 2, this run 5",
    ]


def test_a_resume_with_another_number_of_processes_is_refused() -> None:
    """Each process reads its own batches: a 2-process run resumed on 1 went on at half the
    global batch, in another order, without a word. A checkpoint older than the record of its
    processes is not compared on them."""
    saved = {"data": {"batch_size": 2, "accumulate_grad_batches": 1, "processes": 2}}
    now = {"data": {"batch_size": 2, "accumulate_grad_batches": 1, "processes": 1}}
    assert differences(saved, now) == [
        "processes (trainer.devices x trainer.num_nodes): checkpoint 2, this run 1"
    ]
    older = {"data": {"batch_size": 2, "accumulate_grad_batches": 1}}
    assert differences(older, now) == [] and differences(now, now) == []
    accumulated = {"data": now["data"] | {"accumulate_grad_batches": 2}}  # named by its key
    assert differences(now, accumulated) == [
        "trainer.accumulate_grad_batches: checkpoint 1, this run 2"  # not data.* (probe 47)
    ]


def test_a_moved_copy_of_the_data_resumes(tmp_path: Path, corpus: Path) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None)
    moved = tmp_path / "elsewhere.txt"
    moved.write_bytes(corpus.read_bytes())
    fit(tmp_path, teacher, moved, checkpoint)  # no error: the same bytes


def test_a_new_learning_rate_is_refused_or_applied_on_purpose(tmp_path: Path, corpus: Path) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None, optimizer=adamw(1e-3))
    refused = pytest.raises(ProvenanceMismatch, match=r"optimizer\.lr: checkpoint 0\.001, this run")
    with refused:
        fit(tmp_path, teacher, corpus, checkpoint, "warn", optimizer=adamw(1e-4))
    # one refusal names everything to change: the objective's difference and the optimizer's
    with pytest.raises(ProvenanceMismatch, match=r"(?s)distill\.temperature.*optimizer\.lr"):
        fit(tmp_path, teacher, corpus, checkpoint, optimizer=adamw(1e-4), temperature=2.0)
    seen = LearningRates()
    fit(tmp_path, teacher, corpus, checkpoint, reset=True, optimizer=adamw(1e-4), probe=seen)
    # a fresh optimizer at the new rate (no moments carried over), from step 2 on
    assert seen.at_start == pytest.approx(1e-4) and seen.state_at_start == 0
    assert seen.steps == [2, 3]


def test_a_reset_optimizer_takes_the_schedule_at_the_checkpoints_step(
    tmp_path: Path, corpus: Path
) -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    schedule = functools.partial(warmup_cosine, warmup_fraction=0.25, final_lr_fraction=0.1)
    checkpoint = fit(tmp_path, teacher, corpus, None, optimizer=adamw(1e-3), schedule=schedule)
    seen = LearningRates()
    fit(
        tmp_path,
        teacher,
        corpus,
        checkpoint,
        reset=True,
        optimizer=adamw(1e-4),
        schedule=schedule,
        probe=seen,
    )
    # the new peak rate on the schedule of a 4-step run, as it stands after 2 steps
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-4)
    expected = warmup_cosine(reference, 4, 0.25, 0.1)
    for _ in range(2):
        reference.step()
        expected.step()
    assert seen.at_start == pytest.approx(reference.param_groups[0]["lr"])
    assert seen.at_start != pytest.approx(1e-4)  # not the schedule's start


def adamw(lr: float) -> functools.partial:
    return functools.partial(torch.optim.AdamW, lr=lr, foreach=False)


class LearningRates(Callback):
    """The first optimizer's learning rate and state size as training starts; the steps run."""

    def __init__(self) -> None:
        self.at_start, self.state_at_start, self.steps = None, None, []

    def on_train_start(self, trainer, module) -> None:
        optimizer = trainer.optimizers[0]
        self.at_start = optimizer.param_groups[0]["lr"]
        self.state_at_start = len(optimizer.state)

    def on_train_batch_start(self, trainer, *args) -> None:
        self.steps.append(trainer.global_step)


def test_a_new_schedule_length_is_refused_and_no_steps_left_is_refused(
    tmp_path: Path, corpus: Path
) -> None:
    """A longer cosine would raise the learning rate again mid-run, silently."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    schedule = functools.partial(warmup_cosine, warmup_fraction=0.25, final_lr_fraction=0.1)
    checkpoint = fit(tmp_path, teacher, corpus, None, schedule=schedule)  # 2 steps
    longer = pytest.raises(
        ProvenanceMismatch, match=r"schedule\.max_steps: checkpoint 2, this run 4"
    )
    with longer:
        fit(tmp_path, teacher, corpus, checkpoint, schedule=schedule)  # 4 steps
    with pytest.raises(ProvenanceMismatch, match=r"schedule\.name: checkpoint '"):
        fit(tmp_path, teacher, corpus, checkpoint, "warn")  # the schedule dropped
    module = make_module(teacher)
    trainer = make_trainer(max_steps=1, callbacks=[Provenance()])
    with pytest.raises(
        ProvenanceMismatch, match=r"trainer\.max_steps=1 but .* at optimizer step 2"
    ):
        trainer.fit(module, make_datamodule([corpus]), ckpt_path=checkpoint)


def test_a_resume_that_swaps_the_teachers_cache_for_its_model_is_refused(tmp_path, corpus):
    """Online, the divergence is over the teacher's whole distribution; from a top-k cache,
    over its top k and the rest: another objective (one probe's KD term moved 90×), which a
    resume took silently. A checkpoint saved before the record is not refused for lacking it."""
    from tests.unit.cache.test_cache_teacher import TEACHER, write

    cache = write(tmp_path / "cache", corpus, k=8)
    checkpoint = fit(tmp_path, TEACHER, corpus, None, teacher_cache=str(cache))
    with pytest.raises(
        ProvenanceMismatch, match="teacher.records: checkpoint 'top 8', this run 'full'"
    ):
        fit(tmp_path, TEACHER, corpus, checkpoint)
    saved = torch.load(checkpoint, weights_only=True)[KEY]
    older = {**saved, "teacher": {k: v for k, v in saved["teacher"].items() if k != "records"}}
    assert differences(older, saved) == []


def test_other_clipping_or_rounded_weights_are_refused_and_other_computing_is_said(
    tmp_path: Path, corpus: Path, capsys
) -> None:
    """Clipping changes every update from the resumed step on, and a narrower student.dtype
    rounds the saved weights and moments as they load: both named like the objective. Another
    precision or activation checkpointing only computes the steps otherwise: one line says so."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    checkpoint = fit(tmp_path, teacher, corpus, None, trainer={"gradient_clip_val": 1.0})
    clip = r"trainer\.gradient_clip_val: checkpoint 1\.0, this run 0\.5"
    with pytest.raises(ProvenanceMismatch, match=clip):
        fit(tmp_path, teacher, corpus, checkpoint, trainer={"gradient_clip_val": 0.5})
    algorithm = r"trainer\.gradient_clip_algorithm: checkpoint 'norm', this run 'value'"
    with pytest.raises(ProvenanceMismatch, match=algorithm):
        clipping = {"gradient_clip_val": 1.0, "gradient_clip_algorithm": "value"}
        fit(tmp_path, teacher, corpus, checkpoint, trainer=clipping)
    rounded = r"(?s)rounded as they load.*student\.dtype: checkpoint 'float32', this run 'bfloat16'"
    bf16 = {"dtype": "bfloat16"}
    with pytest.raises(ProvenanceMismatch, match=rounded):
        fit(tmp_path, teacher, corpus, checkpoint, trainer={"gradient_clip_val": 1.0}, student=bf16)
    # teacher.dtype=auto follows the precision: a bf16 teacher is another objective, named
    other = {"gradient_clip_val": 1.0, "precision": "bf16-mixed"}
    with pytest.raises(ProvenanceMismatch, match=r"teacher\.dtype: checkpoint 'float32', this"):
        fit(tmp_path, teacher, corpus, checkpoint, trainer=other)
    capsys.readouterr()
    fit(
        tmp_path,
        TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float32"),
        corpus,
        checkpoint,
        trainer=other,
        student={"activation_checkpointing": True},
    )
    said = capsys.readouterr().out
    assert (
        "steps computed otherwise from here on: trainer.precision: checkpoint '32-true', this "
        in said
    )
    assert "student.activation_checkpointing: checkpoint False, this run True" in said


def test_only_a_student_dtype_that_cannot_hold_the_checkpoints_values_is_lossy() -> None:
    def changes(then: str, now: str) -> tuple[list[str], list[str]]:
        saved, current = ({"compute": {"student_dtype": d}} for d in (then, now))
        return compute_changes(saved, current)

    line = "student.dtype: checkpoint 'bfloat16', this run 'float32'"
    assert changes("bfloat16", "float32") == ([], [line])
    assert changes("float32", "float64")[0] == [] and changes("float16", "float32")[0] == []
    assert changes("float32", "float16")[0] and changes("float16", "bfloat16")[0]
    assert changes("bfloat16", "float16")[0] and changes("float64", "float32")[0]
    assert compute_changes({}, {"compute": {"student_dtype": "float16"}}) == ([], [])


def test_a_checkpoint_that_recorded_teacher_dtype_auto_is_not_compared_on_it() -> None:
    saved = {"teacher": {"dtype": "auto", "path": None}}
    assert differences(saved, {"teacher": {"dtype": "bfloat16", "path": None}}) == []


def test_an_epoch_bounded_runs_schedule_length_is_its_epochs() -> None:
    """max_epochs 2 → 3 was resumed without a word, the cosine re-planned over 9 steps for 6: the
    rate rose mid-run (probe 47). A checkpoint saved before the epochs were recorded is not
    compared on them."""
    schedule = {"name": "lightning_kd.training.optim.warmup_cosine", "max_steps": -1}
    saved = {"schedule": schedule | {"max_epochs": 2}}
    assert differences(saved, {"schedule": schedule | {"max_epochs": 3}}) == [
        "schedule.max_epochs: checkpoint 2, this run 3"
    ]
    assert differences({"schedule": schedule}, {"schedule": schedule | {"max_epochs": 3}}) == []


def test_a_resume_with_another_share_of_the_batches_is_refused() -> None:
    """trainer.limit_val_batches 1.0 → 10 was silent, the summary comparing "before" on 120
    blocks with "after" on 10; limit_train_batches moved the epoch boundaries (probe 47)."""
    data = {"batch_size": 2, "processes": 1, "limit_train_batches": 1.0, "limit_val_batches": 1.0}
    fewer = {"data": data | {"limit_val_batches": 10}}
    assert differences({"data": data}, fewer) == [
        "trainer.limit_val_batches: checkpoint 1.0, this run 10"
    ]
    older = {"data": {"batch_size": 2, "processes": 1}}  # saved before they were recorded
    assert differences(older, fewer) == []


def test_a_warned_resume_with_other_batching_says_the_position_is_lost() -> None:
    """Half the batch and twice the accumulation, warned: the resume retrained 32 samples it had
    seen this epoch, and the warning said only "continuing" (probe 47)."""
    from lightning_kd.training.regrouping import continuing

    batching = ["data.batch_size: checkpoint 4, this run 2"]
    assert "the epoch's position is kept as a batch index" in continuing(batching)
    assert continuing(["distill.temperature: checkpoint 1.0, this run 2.0"]) == (
        "\n(resume_mismatch=warn: continuing)"
    )
