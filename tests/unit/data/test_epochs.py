"""``data/epochs.py``: an epoch that cannot fill a batch or an accumulation window is refused."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from lightning_kd.data.epochs import check_epoch
from lightning_kd.data.errors import DataError


def data(examples: int, batch_size: int, window: int = 1, world: int = 1, **trainer):
    options = {"max_steps": -1, "limit_train_batches": 1.0} | trainer
    return SimpleNamespace(
        train_examples=list(range(examples)),
        batch_size=batch_size,
        stream=None,
        trainer=SimpleNamespace(
            global_rank=0, world_size=world, accumulate_grad_batches=window, **options
        ),
    )


def test_a_batch_larger_than_an_epoch_is_refused() -> None:
    """10 blocks at data.batch_size=64 trained batches of 10, said nowhere."""
    with pytest.raises(DataError, match=r"data.batch_size=64 but an epoch holds 10 training exa"):
        check_epoch(data(10, 64))
    with pytest.raises(DataError, match=r"holds 5 training examples per process.*=5 or less"):
        check_epoch(data(10, 6, world=2))
    check_epoch(data(10, 10))


def test_a_window_longer_than_an_epoch_is_refused() -> None:
    """accumulate_grad_batches=3 over a 1-batch epoch was bit-identical to no accumulation."""
    with pytest.raises(DataError, match=r"accumulate_grad_batches=3 but an epoch is 1 batch"):
        check_epoch(data(10, 10, window=3))
    with pytest.raises(DataError, match=r"accumulate_grad_batches=4 but an epoch is 2 batch"):
        check_epoch(data(40, 4, window=4, limit_train_batches=2))


def test_an_epoch_ending_on_a_shorter_window_is_said_where_the_run_reaches_it() -> None:
    with pytest.warns(UserWarning, match=r"an epoch is 5 batches.*last optimizer step takes 1"):
        check_epoch(data(10, 2, window=2))
    with pytest.warns(UserWarning, match=r"an epoch is 5 batches"):
        check_epoch(data(10, 2, window=2, max_steps=3))  # 6 batches: past the epoch's end
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_epoch(data(10, 2, window=2, max_steps=2))  # 4 batches, within the first epoch
        check_epoch(data(12, 2, window=3))  # 6 batches: two whole windows
        check_epoch(SimpleNamespace(trainer=None, stream=None, train_examples=[1]))
