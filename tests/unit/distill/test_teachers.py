"""Several teachers: the list checked, the weighted objective, each teacher's own divergence."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_kd.distill.accumulation import Window
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teachers import ExtraTeachers, teacher_entries
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, model_from_config
from lightning_kd.models.student import student_from_teacher
from tests.conftest import TEXT, TINY_GPT2
from tests.unit.distill.test_cross_tokenizer import batch_of

MAIN = TeacherSpec(path=None, config=dict(TINY_GPT2), dtype="float32")


def test_entries_inherit_the_teacher_group_and_name_the_main_one():
    entries = teacher_entries(
        [{"name": "a", "weight": 0.25}, {"name": "b", "weight": 0.75, "path": "smollm2"}], MAIN
    )
    assert [entry.main for entry in entries] == [True, False]
    assert entries[0].spec == MAIN
    assert entries[1].spec.path == "smollm2" and entries[1].spec.config is None
    assert entries[1].spec.dtype == "float32"  # inherited


@pytest.mark.parametrize(
    ("teachers", "message"),
    [
        ([{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.4, "path": "x"}], "sum to 1"),
        (
            [{"name": "a", "weight": 0.5, "path": "x"}, {"name": "b", "weight": 0.5, "path": "y"}],
            "exactly once",
        ),
        ([{"name": "a", "weight": 0.5}, {"name": "a", "weight": 0.5, "path": "x"}], "repeat"),
        ([{"name": "a", "weight": 1.0, "paht": "x"}], "unknown keys"),
        ([{"weight": 1.0}], "needs a name and a weight"),
    ],
)
def test_a_bad_teachers_list_is_refused_with_the_fix(teachers, message):
    with pytest.raises(ValueError, match=message):
        teacher_entries(teachers, MAIN)


def models():
    torch.manual_seed(0)
    teacher = model_from_config(dict(TINY_GPT2), "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 3]).double()
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return teacher, student


def step(distiller: Distiller, batch) -> tuple[torch.Tensor, object, list[torch.Tensor]]:
    objective, sums = distiller(batch)
    objective.backward()
    return objective.detach(), sums, [p.grad for p in distiller.student.parameters()]


@pytest.mark.parametrize("cross", [False, True])
def test_two_copies_of_one_teacher_are_that_teacher(cross):
    """Weights 0.3 and 0.7 on the same teacher (the second through the cross-tokenizer path):
    the objective and gradients of the teacher alone, each divergence reported."""
    teacher, student = models()
    config = DistillConfig(compile=False, cross_top_k=257)
    batch = batch_of(TEXT)
    alone = step(Distiller(teacher, copy.deepcopy(student), config), batch)
    tokenizer = byte_tokenizer()
    crosses = [CrossTokenizer(tokenizer, tokenizer, 257, 257, top_k=257) if cross else None]
    extra = ExtraTeachers([copy.deepcopy(teacher)], ["copy"], [0.7], crosses)
    both = Distiller(
        teacher, copy.deepcopy(student), config, extra=extra, teacher_weight=("main", 0.3)
    )
    together = step(both, batch)
    torch.testing.assert_close(together[0], alone[0], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(together[1].kd, alone[1].kd, rtol=1e-10, atol=1e-12)
    assert set(together[1].teachers) == {"main", "copy"}
    torch.testing.assert_close(together[1].teachers["copy"], alone[1].kd, rtol=1e-10, atol=1e-12)
    for a, b in zip(together[2], alone[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert not any(p.requires_grad for p in both.extra_teachers.parameters())
    both.train()
    assert not both.extra_teachers.models[0].training


def test_the_window_reports_each_teachers_divergence():
    teacher, student = models()
    extra = ExtraTeachers([copy.deepcopy(teacher)], ["copy"], [0.5], [None])
    config = DistillConfig(compile=False)
    distiller = Distiller(teacher, student, config, extra=extra, teacher_weight=("main", 0.5))
    window = Window()
    for rows in (slice(0, 1), slice(1, 2)):
        window.add(distiller({k: v[rows] for k, v in batch_of(TEXT).items()})[1])
    totals = window.reduced()
    means = Window.means(totals, distiller.objective)
    assert {"kd/main", "kd/copy"} <= set(means)
    torch.testing.assert_close(means["kd/main"], means["kd/copy"])
    torch.testing.assert_close(means["kd"], means["kd/main"])
