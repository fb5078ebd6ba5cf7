"""``utils/rng.py``: random state kept across a resume, and random initialisation that draws the
same numbers whatever torch's default dtype."""

from __future__ import annotations

import torch

from lightning_kd.models.digests import weights_digest
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.utils.rng import float32_init
from tests.conftest import TINY_LLAMA, make_module


def test_a_seeded_config_teacher_is_the_same_model_under_a_float64_default() -> None:
    """Lightning's 64-true builds models under a float64 default dtype: the same init_seed drew
    another teacher there, whose digest refused the cache written for that very run."""
    spec = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float64")
    plain = weights_digest(load_teacher(spec))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        guarded = weights_digest(float32_init(load_teacher)(spec))
        assert torch.get_default_dtype() == torch.float64  # the caller's default is put back
        unguarded = weights_digest(load_teacher(spec))
    finally:
        torch.set_default_dtype(before)
    assert guarded == plain != unguarded


def test_the_module_builds_its_models_as_under_float32() -> None:
    teacher = TeacherSpec(path=None, config=dict(TINY_LLAMA), dtype="float64")
    digests = []
    for default in (torch.float32, torch.float64):
        module = make_module(teacher)
        before = torch.get_default_dtype()
        torch.set_default_dtype(default)  # as Lightning's 64-true sets it around configure_model
        try:
            module.configure_model()
        finally:
            torch.set_default_dtype(before)
        digests.append((module.teacher_digest, weights_digest(module.student)))
    assert digests[0] == digests[1]
