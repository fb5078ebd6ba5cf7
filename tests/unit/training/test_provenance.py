"""Checkpoints record the teacher, tokenizer and objective; a resume with others is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.provenance import Provenance, ProvenanceMismatch
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer


def fit(tmp_path: Path, teacher: TeacherSpec, corpus: Path, ckpt: Path | None, mode="error", **d):
    module = make_module(teacher, **d)
    trainer = make_trainer(
        max_steps=4 if ckpt else 2,
        enable_checkpointing=True,
        callbacks=[LastCheckpoint(str(tmp_path / "checkpoints"), every=1), Provenance(mode)],
    )
    trainer.fit(module, make_datamodule([corpus]), ckpt_path=ckpt)
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


def test_a_lora_resume_onto_another_base_student_is_refused(tmp_path: Path, corpus: Path) -> None:
    """The base is rebuilt, not read from the checkpoint: adapters trained on layers [0, 3] must
    not silently continue on a student copied from layers [1, 3] (same shapes, other weights)."""
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA))
    lora = {"r": 2, "alpha": 4}
    checkpoint = fit(tmp_path, teacher, corpus, None, student={"layers": [0, 3], "lora": lora})
    with pytest.raises(ProvenanceMismatch, match=r"student\.base: checkpoint '"):
        fit(tmp_path, teacher, corpus, checkpoint, student={"layers": [1, 3], "lora": lora})
