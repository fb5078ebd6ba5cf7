"""``train/grad_norm``: the norm of each optimizer step's gradient, before clipping
(``training/grad_norm.py``)."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import torch

from lightning_kd.training.grad_norm import gradient_norm
from tests.conftest import make_datamodule, make_module, make_trainer


def test_each_steps_gradient_norm_is_logged_before_clipping(tiny_teacher, corpus, tmp_path) -> None:
    """No gradient norm was logged: a long run's first sign of trouble (probe 47)."""
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="", version="")
    trainer = make_trainer(max_steps=3, logger=logger, log_every_n_steps=1, gradient_clip_val=1e-3)
    trainer.fit(make_module(tiny_teacher), make_datamodule([corpus]))
    logger.save()
    with open(tmp_path / "metrics.csv") as handle:
        logged = [
            float(row["train/grad_norm"])
            for row in csv.DictReader(handle)
            if row["train/grad_norm"]
        ]
    assert len(logged) == 3 and all(norm > 1e-2 for norm in logged)  # before clipping to 1e-3


def test_sharded_gradients_log_no_norm() -> None:
    """A process's norm of sharded gradients would be its shard's."""
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.full((3,), 2.0)
    whole = SimpleNamespace(
        model=None, strategy=SimpleNamespace(handles_gradient_accumulation=False)
    )
    assert gradient_norm(whole, [param]) == {"train/grad_norm": torch.tensor(12.0).sqrt().item()}
    deepspeed = SimpleNamespace(
        model=None, strategy=SimpleNamespace(handles_gradient_accumulation=True)
    )
    assert gradient_norm(deepspeed, [param]) == {}
    assert gradient_norm(whole, []) == {}
