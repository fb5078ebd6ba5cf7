"""A hand-built batch: checked, and nothing scored at a padded position, whichever side."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.distill.batches import checked_batch, unpadded_labels
from lightning_kd.distill.distiller import Distiller
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.models.loading import model_from_config
from lightning_kd.models.student import student_from_teacher
from tests.conftest import TINY_GPT2, TINY_LLAMA

IDS = torch.tensor([[5, 17, 42, 9, 120, 33]])
ONES = torch.ones_like(IDS)


def distiller() -> Distiller:
    torch.manual_seed(0)
    teacher = model_from_config(dict(TINY_LLAMA), "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 3]).double()
    return Distiller(teacher, student, DistillConfig(compile=False, ce_weight=0.5, kd_weight=0.5))


def padded(side: str, pad: int = 3) -> dict[str, torch.Tensor]:
    """``IDS`` padded by ``pad`` positions on ``side``, labels = input_ids (as a user writes)."""
    fill = torch.zeros(1, pad, dtype=torch.long)
    parts = (fill, IDS) if side == "left" else (IDS, fill)
    mask = (torch.zeros_like(fill), torch.ones_like(IDS))
    ids = torch.cat(parts, dim=1)
    attention = torch.cat(mask if side == "left" else mask[::-1], dim=1)
    return {"input_ids": ids, "attention_mask": attention, "labels": ids.clone()}


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_row_scores_what_the_unpadded_row_scores(side: str) -> None:
    """Right padding with labels = input_ids made each pad a target (the student taught to write
    the pad token, SmolLM2's <|im_end|>); left padding scored a pad's output against the first
    real token. Llama's rotary positions make the left-padded row's values the same too."""
    model = distiller()
    plain = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": IDS.clone()}
    _, expected = model(plain)
    _, got = model(padded(side))
    assert int(got.tokens) == int(expected.tokens) == IDS.shape[1] - 1
    torch.testing.assert_close(got.ce, expected.ce, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got.kd, expected.kd, rtol=1e-9, atol=1e-9)
    evaluated = model.evaluate(padded(side))
    assert int(evaluated["ppl"][1]) == IDS.shape[1] - 1


def test_labels_are_masked_on_pads_and_after_them_only() -> None:
    labels = torch.tensor([[7, 8, 9, 10], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    assert unpadded_labels(labels, mask).tolist() == [[-100, -100, 9, 10], [7, 8, 9, -100]]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ({"input_ids": IDS, "attention_mask": ONES}, r"lacks \['labels'\]"),
        ({"input_ids": IDS, "labels": IDS}, r"lacks \['attention_mask'\]"),
        ({"input_ids": IDS[0], "attention_mask": ONES[0], "labels": IDS[0]}, r"shape \(6,\)"),
        ({"input_ids": [1, 2], "attention_mask": ONES, "labels": IDS}, r"input_ids is list"),
        # A tokenizer called without return_tensors: every key a list (probe 51 F1).
        ({"input_ids": IDS, "attention_mask": [[1] * 6], "labels": IDS}, "attention_mask is list"),
        ({"input_ids": IDS, "attention_mask": ONES, "labels": [[1] * 6]}, "labels is list"),
        (
            {"input_ids": IDS, "attention_mask": ONES, "labels": IDS, "position_ids": [0, 1]},
            "position_ids is list.*return_tensors='pt'",
        ),
        ({"input_ids": IDS, "attention_mask": ONES, "labels": IDS[:, 1:]}, r"labels has shape"),
        ({"input_ids": IDS, "attention_mask": None, "labels": IDS}, r"lacks \['attention_mask'\]"),
        (
            {"input_ids": IDS, "attention_mask": ONES, "labels": None},
            r"lacks \['labels'\] \(it has \['attention_mask', 'input_ids'\]\)",
        ),
        (
            {"input_ids": IDS[:0], "attention_mask": ONES[:0], "labels": IDS[:0]},
            r"\(0, 6\): no row",
        ),
        ({"input_ids": IDS[:, :0], "attention_mask": ONES[:, :0], "labels": IDS[:, :0]}, "no row"),
        (
            {"input_ids": IDS.float(), "attention_mask": ONES, "labels": IDS},
            r"torch.float32; input_ids are integers",
        ),
        (
            {"input_ids": IDS, "attention_mask": ONES, "labels": IDS.float()},
            r"labels are torch.float32",
        ),
        # A mask of segment ids (1, 2 per document): it shifted the positions without an error.
        (
            {"input_ids": IDS, "attention_mask": ONES + (IDS > 20), "labels": IDS},
            r"attention_mask holds 3 value\(s\) other than 0 and 1",
        ),
        (
            {"input_ids": IDS, "attention_mask": ONES * 2, "labels": IDS},
            r"holds 6 value.*position_ids",
        ),
        (
            {
                "input_ids": IDS,
                "attention_mask": ONES.bool(),
                "labels": IDS,
                "position_ids": IDS.float(),
            },
            r"position_ids are torch.float32",
        ),
        ({"input_ids": IDS * 1000, "attention_mask": ONES, "labels": IDS}, r"hold 120000, outside"),
        ({"input_ids": -IDS, "attention_mask": ONES, "labels": IDS}, r"hold -120, outside"),
        ({"input_ids": IDS, "attention_mask": ONES, "labels": IDS * 1000}, r"labels hold 6 value"),
        ({"input_ids": IDS, "attention_mask": ONES, "labels": -IDS}, r"labels hold 6 value"),
        (
            {"input_ids": IDS, "attention_mask": ONES, "labels": IDS, "position_ids": IDS[:, 1:]},
            "position_ids has",
        ),
    ],
)
def test_a_malformed_batch_is_named(batch: dict, message: str) -> None:
    """Refused before a model reads it: some used to reach it (an AttributeError on a None mask,
    a reshape of no element, an embedding's IndexError, the loss kernel's out-of-bounds)."""
    student = model_from_config(dict(TINY_LLAMA), "causal_lm")  # 257 tokens
    with pytest.raises(ValueError, match=message):
        checked_batch(batch, "causal_lm", student)
    with pytest.raises(ValueError, match=message):
        distiller()(batch)


@pytest.mark.parametrize("batch", [(IDS, ONES, IDS), [{"input_ids": IDS}]], ids=["tuple", "list"])
def test_a_batch_that_is_no_dict_is_named(batch) -> None:
    """A collator's tuple reached ``batch.get``: an AttributeError (probe 51 F1)."""
    with pytest.raises(ValueError, match=f"the batch is a {type(batch).__name__}: .* in a dict"):
        distiller()(batch)


@pytest.mark.parametrize("config", [TINY_GPT2, TINY_LLAMA], ids=["absolute", "rotary"])
def test_a_left_padded_row_reads_its_text_at_the_unpadded_positions(config: dict) -> None:
    """A model of absolute positions (GPT-2) read a row left-padded by 3 at positions 3, 4, …:
    another input (a probe's KD term 22 % off). Its positions now start at its first token; a
    batch's own ``position_ids`` are used as given."""
    torch.manual_seed(0)
    teacher = model_from_config(dict(config), "causal_lm").double().eval()
    student = student_from_teacher(teacher, [0, 1]).double()
    model = Distiller(teacher, student, DistillConfig(compile=False, ce_weight=0.5, kd_weight=0.5))
    plain = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": IDS.clone()}
    _, expected = model(plain)
    _, got = model(padded("left"))
    torch.testing.assert_close(got.kd, expected.kd, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got.ce, expected.ce, rtol=1e-9, atol=1e-12)
    shifted = padded("left") | {"position_ids": torch.arange(9).unsqueeze(0)}  # the old reading
    _, moved = model(shifted)
    moves = abs(float(moved.ce - expected.ce)) > 1e-6 * float(expected.ce)
    assert moves == (config is TINY_GPT2)  # rotary models read only positions' differences


def test_a_batch_of_the_data_modules_is_unchanged() -> None:
    """Their labels mask every pad already; packed blocks have no pad at all."""
    batch = {"input_ids": IDS, "attention_mask": torch.ones_like(IDS), "labels": IDS.clone()}
    assert torch.equal(checked_batch(batch, "causal_lm")["labels"], IDS)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
def test_integer_ids_of_any_width_are_read_as_the_same_ids(dtype) -> None:
    """int16 ids reached the embedding, which refused them in torch's words ("Expected tensor
    for argument #1 'indices' to have one of the following scalar types: Long, Int")."""
    model = distiller()
    batch = {"input_ids": IDS, "attention_mask": ONES, "labels": IDS.clone()}
    narrow = {key: value.to(dtype) for key, value in batch.items()}
    given = {key: value.clone() for key, value in narrow.items()}
    _, want = model(batch)
    _, got = model(narrow)
    assert float(got.ce) == float(want.ce) and float(got.kd) == float(want.kd)
    assert all(torch.equal(narrow[key], given[key]) for key in narrow), "the caller's batch"
    assert all(narrow[key].dtype == dtype for key in narrow)
