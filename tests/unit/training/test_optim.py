"""The learning-rate schedule: transformers' cosine with a floor, as this package always ran it."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_kd.training.optim import decay_groups, warmup_cosine


def reference_factor(
    step: int, total_steps: int, warmup_fraction: float, final_lr_fraction: float
) -> float:
    """The hand-written schedule ``warmup_cosine`` had before it used transformers' (verbatim)."""
    warmup = max(1, round(warmup_fraction * total_steps)) if warmup_fraction > 0 else 0
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def learning_rates(steps: int, **schedule) -> list[float]:
    """The rate each of ``steps`` optimizer steps trains at (peak 2.0), in both of the
    parameter groups the module's optimizer has (``decay_groups``)."""
    groups = decay_groups(
        [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))]
    )
    optimizer = torch.optim.AdamW(groups, lr=2.0)
    scheduler = warmup_cosine(optimizer, **schedule)
    rates = []
    for _ in range(steps):
        decayed, undecayed = (group["lr"] for group in optimizer.param_groups)
        assert decayed == undecayed
        rates.append(decayed)
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize(
    ("total_steps", "warmup_fraction", "final_lr_fraction"),
    [
        (100, 0.05, 0.1),  # the default
        (300, 0.1, 0.0),
        (37, 0.3, 0.5),
        (10, 0.0, 0.1),  # no warmup: the first step trains at the peak
        (1, 0.05, 0.1),  # warmup rounds to 0 steps, max(1, …) makes it 1: that step trains
        (3, 0.05, 0.1),  # warmup as long as (1 of 3) or longer than the rounding gives
        (2, 0.9, 0.1),  # warmup takes every step
    ],
)
def test_schedule_equals_the_hand_written_one(
    total_steps: int, warmup_fraction: float, final_lr_fraction: float
) -> None:
    # Two steps past the end too: Lightning's estimate can fall short; the rate holds the floor.
    steps = total_steps + 2
    schedule = {
        "total_steps": total_steps,
        "warmup_fraction": warmup_fraction,
        "final_lr_fraction": final_lr_fraction,
    }
    expected = [
        2.0 * reference_factor(step, total_steps, warmup_fraction, final_lr_fraction)
        for step in range(steps)
    ]
    assert learning_rates(steps, **schedule) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_where_transformers_schedule_differs() -> None:
    """The two edges ``warmup_cosine`` keeps from its hand-written past, against transformers'
    own ``get_cosine_with_min_lr_schedule_with_warmup`` with the same settings."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    plain = get_cosine_with_min_lr_schedule_with_warmup(optimizer, 2, 10, min_lr_rate=0.1)
    (factor,) = plain.lr_lambdas
    ours = learning_rates(14, total_steps=10, warmup_fraction=0.2, final_lr_fraction=0.1)
    ours = [rate / 2.0 for rate in ours]
    assert factor(0) == 0.0 and ours[0] == 0.5  # transformers' first step trains at 0
    assert ours[1] == factor(2) == ours[2] == 1.0  # the peak: last warmup step, first cosine step
    for step in range(2, 11):
        assert ours[step] == pytest.approx(factor(step), rel=1e-12)  # the cosine itself
    assert factor(12) > 0.1 and ours[12] == pytest.approx(0.1)  # past the end: rises / holds


def test_warmup_fraction_out_of_range_names_the_value() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"warmup_fraction=1.0 must lie in \[0, 1\)"):
        warmup_cosine(optimizer, total_steps=10, warmup_fraction=1.0)


def test_decay_groups_read_zero3_shapes_and_drop_empty_groups() -> None:
    """ZeRO-3 leaves a partitioned matrix an empty 1-D tensor with its shape in ``ds_shape``: it
    still decays. A group left empty is dropped (DeepSpeed would drop it under the scheduler)."""
    partitioned = torch.nn.Parameter(torch.empty(0))
    partitioned.ds_shape = torch.Size([4, 2])
    gain = torch.nn.Parameter(torch.ones(4))
    groups = decay_groups([partitioned, gain])
    assert [group["params"] for group in groups] == [[partitioned], [gain]]
    assert groups[1]["weight_decay"] == 0.0
    only_matrices = decay_groups([torch.nn.Parameter(torch.zeros(2, 2))])
    assert len(only_matrices) == 1 and "weight_decay" not in only_matrices[0]


def test_a_lengthened_schedule_is_the_same_from_a_step_its_warmups_passed() -> None:
    """scheduler=constant, "for runs that will be continued": its extension was refused as
    another schedule (probe 47). A cosine's is another, as is a warmup the step is inside."""
    from functools import partial

    from lightning_kd.training.optim import same_rates_from, warmup_cosine

    constant = partial(warmup_cosine, warmup_fraction=0.05, final_lr_fraction=1.0)
    cosine = partial(warmup_cosine, warmup_fraction=0.05, final_lr_fraction=0.1)
    assert same_rates_from(constant, 200, then=200, now=600)
    assert not same_rates_from(constant, 20, then=200, now=600)  # inside the new, longer warmup
    assert not same_rates_from(cosine, 200, then=200, now=600)
    assert not same_rates_from(None, 200, then=200, now=600)
    assert not same_rates_from(constant, 200, then=-1, now=600)  # an epoch-bounded run
