"""Cross-tokenizer refusals are found with the config, before the data is read: only the
tokenizers load, and only where the config asks the cross-tokenizer path what it cannot serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_kd.distill import tokenizer_pairs
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teacher_entries import teacher_entries
from lightning_kd.launch import tokenizer_checks
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.tokenizer_checks import tokenizer_pair_errors
from lightning_kd.losses.logits import IGNORE_INDEX
from lightning_kd.models.loading import StudentSpec, byte_tokenizer
from tests.conftest import sentencepiece_tokenizer
from tests.integration.test_cross_tokenizer_run import save_model
from tests.unit.distill.test_on_policy import TEACHER

FEATURES = "distill.features matches hidden states position by position"
TOP_K = ("distill.on_policy=1.0", "distill.on_policy_teacher_top_k=5")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A teacher with a SentencePiece tokenizer and a student source with the byte one."""
    teacher = save_model(tmp_path / "teacher", sentencepiece_tokenizer(), 0)
    return teacher, save_model(tmp_path / "student", byte_tokenizer(), 1)


def errors(*overrides: str) -> list[str]:
    return tokenizer_pair_errors(compose_config(["debug=smoke", *overrides]))


def test_a_cross_tokenizer_teacher_asked_for_features_is_refused_with_the_config(pair) -> None:
    """It was refused once the trainer was set up and the data tokenised."""
    teacher, student = pair
    cross = [f"teacher.path={teacher}", "teacher.config=null", f"student.source={student}"]
    (error,) = errors(*cross, "student.num_layers=2", "distill.features=spans")
    assert error.startswith("cross-tokenizer distillation (the student's tokenizer is not")
    assert FEATURES in error
    (error,) = errors(*cross, "student.num_layers=2", "distill.features=null", *TOP_K)
    assert "distill.on_policy_teacher_top_k swaps in the teacher's tokens" in error
    assert errors(*cross, "student.num_layers=2", "distill.features=null") == []
    # The same tokenizer on both sides: nothing to refuse.
    same = [f"teacher.path={student}", "teacher.config=null", f"student.source={student}"]
    assert errors(*same, "student.num_layers=2", "distill.features=spans") == []


def test_a_second_teacher_of_another_tokenizer_serves_interleaved_sampling(pair) -> None:
    """Interleaved sampling reads the main teacher alone: with a second teacher of another
    tokenizer, distill.on_policy_teacher_top_k was refused once both had loaded."""
    teacher, _ = pair
    two = f"teachers=[{{name: a, weight: 0.5}}, {{name: b, weight: 0.5, path: '{teacher}'}}]"
    assert errors(two, *TOP_K, "distill.features=null") == []
    entries = teacher_entries(
        [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "path": str(teacher)}],
        TEACHER,
    )
    options = {"on_policy": 1.0, "on_policy_tokens": 5, "on_policy_teacher_top_k": 5}
    # An untrained student samples bytes no tokenizer spells back: no share of them is asked.
    distill = DistillConfig(compile=False, cross_min_aligned=0.0, **options)
    student = StudentSpec(num_layers=2)
    distiller = Distiller.from_specs(
        TEACHER, student, distill, byte_tokenizer(), "32-true", teachers=entries
    )
    text = "Question: why is the sky blue? Answer: light."
    ids = torch.tensor([byte_tokenizer()(text)["input_ids"]])
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 32:] = ids[0, 32:]  # the prompt unscored, the answer scored
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    objective, sums = distiller(batch, draw=3)
    assert torch.isfinite(objective) and set(sums.teachers) == {"a", "b"}


def test_no_tokenizer_loads_where_the_config_asks_nothing_of_the_cross_path(monkeypatch) -> None:
    def refuse_to_load(spec):
        raise AssertionError("a tokenizer loaded")

    monkeypatch.setattr(tokenizer_pairs, "load_tokenizer", refuse_to_load)
    monkeypatch.setattr(tokenizer_checks, "run_tokenizer", refuse_to_load)
    assert errors("distill.features=spans") == []  # the student reads the teacher's tokenizer
