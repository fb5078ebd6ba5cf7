"""``trainer.accelerator`` and ``trainer.devices`` refused before anything loads
(``launch/device_checks.py``); found by Lightning, they were tracebacks after the teacher loaded."""

from __future__ import annotations

import pytest
from lightning.pytorch.accelerators import CUDAAccelerator

from lightning_kd.launch.device_checks import (
    accelerator_errors,
    devices_errors,
    strategy_name_errors,
)


def trainer(**settings) -> dict:
    return {"trainer": settings}


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: False))


@pytest.fixture
def a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: True))


def test_an_accelerator_lightning_does_not_know_is_named_with_the_choices() -> None:
    assert accelerator_errors(trainer(accelerator="bogus")) == [
        "trainer.accelerator='bogus': choose one of auto, gpu, cpu, cuda, mps, tpu; e.g. "
        "trainer.accelerator=auto (a GPU where there is one, else the CPU)"
    ]
    for fine in ("auto", "cpu", "CPU", None):
        assert accelerator_errors(trainer(accelerator=fine)) == []
    assert accelerator_errors({}) == []


def test_a_gpu_on_a_machine_without_one_is_refused(no_gpu) -> None:
    for name in ("gpu", "cuda"):
        (error,) = accelerator_errors(trainer(accelerator=name))
        assert error.startswith(f"trainer.accelerator={name}: this machine has no")
        assert "set trainer.accelerator=auto" in error


def test_a_gpu_where_there_is_one_is_taken(a_gpu) -> None:
    assert accelerator_errors(trainer(accelerator="gpu")) == []
    assert devices_errors(trainer(accelerator="gpu", devices=[0, 1])) == []
    assert devices_errors(trainer(devices=-1)) == []  # auto finds the GPUs: every one


def test_devices_other_than_a_count_auto_or_gpu_indices_are_refused(no_gpu) -> None:
    for bad in ("abc", 2.5, 0, -2, True, [], [0, 0], [-1]):
        (error,) = devices_errors(trainer(devices=bad))
        assert error.startswith(f"trainer.devices={bad!r}: must be an integer >= 1"), error
    for fine in (1, 4, "auto"):
        assert devices_errors(trainer(devices=fine)) == []
    assert devices_errors(trainer(devices=[0, 1], accelerator="cpu")) == [
        "trainer.devices=[0, 1] lists GPU indices, which only trainer.accelerator=gpu takes; "
        "give a count, e.g. trainer.devices=2"
    ]
    (error,) = devices_errors(trainer(devices=-1))  # Lightning's CPU takes counts alone
    assert error.startswith("trainer.devices=-1 (every GPU) on the CPU")


def test_a_strategy_that_trains_in_processes_apart_or_no_strategy_is_refused_by_name() -> None:
    """``trainer.strategy=ddp_spawn`` trained, then the launching process, which holds no
    trained student, failed to export it (an AttributeError; a resume did the same)."""
    for name in ("ddp_spawn", "ddp_fork", "ddp_notebook_find_unused_parameters_true"):
        (error,) = strategy_name_errors(trainer(strategy=name))
        assert error.startswith(f"trainer.strategy={name} runs training in processes started")
        assert "use strategy=ddp trainer.devices=N" in error
    (error,) = strategy_name_errors(trainer(strategy="bogus"))
    assert error.startswith("trainer.strategy='bogus': not a strategy Lightning knows")
    for fine in ("auto", "ddp", "fsdp", {"_target_": "lightning_kd.training.strategies.ddp"}):
        assert strategy_name_errors(trainer(strategy=fine)) == []
