"""``distill/assembly.py``: what a Distiller is built from, checked as it is built."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.loading import model_from_config
from lightning_kd.models.student import student_from_teacher
from tests.conftest import TINY_LLAMA

CONFIG = DistillConfig(compile=False)


def teacher() -> nn.Module:
    torch.manual_seed(0)
    return model_from_config(dict(TINY_LLAMA), "causal_lm").eval()


def test_a_student_holding_the_teachers_layers_is_refused() -> None:
    """Layers taken from the teacher rather than copied were frozen with it: the student
    trained its embeddings alone, without a word. The teacher as its own student failed only
    at backward, in torch's words."""
    model = teacher()
    taken = student_from_teacher(model, [0, 3])
    taken.model.layers = nn.ModuleList([model.model.layers[0], model.model.layers[3]])
    with pytest.raises(ValueError, match=r"the student shares \d+ of the teacher's parameter"):
        Distiller(model, taken, CONFIG)
    whole = r"the student is the teacher: it holds \d+ of .*copy.deepcopy"
    with pytest.raises(ValueError, match=whole):
        Distiller(model, model, CONFIG)
    Distiller(model, copy.deepcopy(model), CONFIG)  # a copy is its own


def test_the_trainable_parameters_are_never_the_teachers() -> None:
    model = teacher()
    distiller = Distiller(model, student_from_teacher(model, [0, 3]), CONFIG)
    own = {id(p) for p in distiller.student.parameters()}
    distiller.teacher.requires_grad_(True)  # a caller's mistake: the teacher stays out
    assert {id(p) for p in distiller.trainable_parameters()} == own


def test_the_trainable_parameters_are_never_another_teachers() -> None:
    """After distiller.requires_grad_(True), the other teachers' tensors joined the optimizer's
    groups (probe 51)."""
    from lightning_kd.distill.teachers import ExtraTeachers

    model = teacher()
    extra = ExtraTeachers(["b"], [0.5], [copy.deepcopy(model)], [None])
    student = student_from_teacher(model, [0, 3])
    distiller = Distiller(model, student, CONFIG, extra=extra, teacher_weight=("a", 0.5))
    own = {id(p) for p in distiller.student.parameters()}
    distiller.requires_grad_(True)
    assert {id(p) for p in distiller.trainable_parameters()} == own


def test_a_teacher_and_student_of_two_vocabularies_are_refused_built_by_hand() -> None:
    """Built by hand, a teacher of 257 rows and a student of 600 were distilled over the rows
    they share, without a word (probe 51). Padding rows apart (Qwen's 151,936 and 152,064)."""
    torch.manual_seed(0)
    model = teacher()
    other = model_from_config(
        {**TINY_LLAMA, "vocab_size": 600, "num_hidden_layers": 2}, "causal_lm"
    )
    with pytest.raises(ValueError, match=r"teacher's head has 257 rows and the student's 600"):
        Distiller(model, other, CONFIG)
    padded = model_from_config(
        {**TINY_LLAMA, "vocab_size": 320, "num_hidden_layers": 2}, "causal_lm"
    )
    distiller = Distiller(model, padded, CONFIG)  # 63 padding rows: one tokenizer's
    # An id the student has a row for and the smaller teacher has not: the teacher's
    # embedding's bare IndexError (probe 51).
    ids = torch.tensor([[5, 300, 7]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    with pytest.raises(ValueError, match=r"input_ids hold 300, outside .* \[0, 257\)"):
        distiller(batch)
