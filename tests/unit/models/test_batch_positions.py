"""The positions a model reads a batch at: refused outside its position table (probe 51 F2)."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.batch_positions import model_positions
from lightning_kd.models.loading import model_from_config
from lightning_kd.models.student import student_from_teacher
from tests.conftest import TINY_GPT2, TINY_LLAMA

CONFIGS = {"gpt2": TINY_GPT2, "llama": TINY_LLAMA}  # 64 learned positions, 128 rotary ones
LIMITS = {"gpt2": 64, "llama": 128}


def batch(length: int, **extra: torch.Tensor) -> dict[str, torch.Tensor]:
    ids = torch.arange(length).remainder(200).unsqueeze(0) + 5
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids, **extra}


def distiller(name: str) -> Distiller:
    torch.manual_seed(0)
    teacher = model_from_config(dict(CONFIGS[name]), "causal_lm").eval()
    student = student_from_teacher(teacher, [0, 1])
    return Distiller(teacher, student, DistillConfig(compile=False, ce_weight=0.5, kd_weight=0.5))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_row_longer_than_the_position_table_is_refused_naming_the_limit(name: str) -> None:
    """GPT-2's learned positions failed with an embedding's bare IndexError (a device-side
    assert on a GPU); a rotary model scored positions it never saw."""
    limit = LIMITS[name]
    model = distiller(name)
    objective, sums = model(batch(limit))  # the whole table: fine
    assert torch.isfinite(objective) and int(sums.tokens) == limit - 1
    message = rf"reach {limit}, past .*'s {limit} positions \(config max_position_embeddings"
    with pytest.raises(ValueError, match=message):
        model(batch(limit + 1))
    with pytest.raises(ValueError, match=message):
        model.evaluate(batch(limit + 1))


@pytest.mark.parametrize("name", CONFIGS)
def test_given_position_ids_outside_the_table_are_refused(name: str) -> None:
    """Negative ones read OPT's offset rows without an error; too large ones hit the table's end."""
    model = distiller(name)
    with pytest.raises(ValueError, match=r"position_ids hold -1: positions count from 0"):
        model(batch(8, position_ids=torch.arange(8).unsqueeze(0) - 1))
    past = torch.arange(8).unsqueeze(0) + LIMITS[name] - 4
    with pytest.raises(ValueError, match=rf"position_ids reach {LIMITS[name] + 3}, past"):
        model(batch(8, position_ids=past))


def test_a_left_padded_row_longer_than_the_table_is_read_at_its_own_positions() -> None:
    """Only the attended tokens count: a row of 60 tokens after 10 pads fits GPT-2's 64."""
    model = distiller("gpt2")
    row = batch(70)
    row["attention_mask"][:, :10] = 0
    objective, sums = model(row)
    assert torch.isfinite(objective) and int(sums.tokens) == 59
    assert int(model_positions(model.student, row).max()) == 59
