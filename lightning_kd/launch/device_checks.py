"""``trainer.accelerator``, ``trainer.devices`` and a ``trainer.strategy`` name checked before
anything loads.

Lightning judges both when it builds the Trainer, which a run reaches after the teacher has loaded
(and, with ``distill.teacher_cache=auto``, after a Fabric was made for it): a GPU asked for on a
machine without one was a ``RuntimeError`` traceback 40 s in, and ``trainer.devices=abc`` was
taken for "several processes" before Lightning's ``TypeError``. Here each is refused by name, with
what this machine has and an example.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

from lightning_kd.launch.rules import ABSENT, lookup

GPU_NAMES = ("gpu", "cuda", "mps")
"""Accelerators that are GPUs: ``trainer.devices`` may list their indices."""
GPU_KINDS = ("cuda", "mps")
"""Lightning's GPU accelerators: what ``gpu`` (and ``auto``) may pick."""


def accelerator_errors(cfg: Mapping) -> list[str]:
    """``trainer.accelerator``: a name Lightning knows, and hardware this machine has."""
    accelerator = lookup(cfg, "trainer.accelerator")
    if accelerator in (ABSENT, None, "auto"):
        return []
    known = sorted(AcceleratorRegistry.available_accelerators())
    if not isinstance(accelerator, str) or accelerator.lower() not in {*known, "gpu"}:
        return [
            f"trainer.accelerator={accelerator!r}: choose one of auto, gpu, {', '.join(known)}; "
            "e.g. trainer.accelerator=auto (a GPU where there is one, else the CPU)"
        ]
    name = accelerator.lower()
    if any(map(available, GPU_KINDS if name == "gpu" else (name,))):
        return []
    present = [kind for kind in known if available(kind)]
    return [
        f"trainer.accelerator={accelerator}: this machine has no {name.upper()} (it has "
        f"{', '.join(present)}); run on a machine with one, or set trainer.accelerator=auto"
    ]


def devices_errors(cfg: Mapping) -> list[str]:
    """``trainer.devices``: a count (``-1``: all), ``auto``, or a GPU accelerator's indices."""
    devices = lookup(cfg, "trainer.devices")
    accelerator = lookup(cfg, "trainer.accelerator")
    gpu = isinstance(accelerator, str) and accelerator.lower() in GPU_NAMES
    if devices == -1 and not (gpu or (accelerator in (ABSENT, None, "auto") and any_gpu())):
        return [  # Lightning: "devices selected with CPUAccelerator should be an int > 0"
            "trainer.devices=-1 (every GPU) on the CPU: give a count of processes, e.g. "
            "trainer.devices=2"
        ]
    if devices is ABSENT or devices == "auto" or is_count(devices):
        return []
    if is_index_list(devices):
        if gpu:
            return []
        return [
            f"trainer.devices={list(devices)!r} lists GPU indices, which only "
            "trainer.accelerator=gpu takes; give a count, e.g. trainer.devices=2"
        ]
    return [
        f"trainer.devices={devices!r}: must be an integer >= 1 (or -1 for all, or auto"
        + (", or a list of GPU indices" if gpu else "")
        + "); e.g. trainer.devices=1"
    ]


LAUNCHED_HERE = ("spawn", "fork", "notebook")
"""Lightning strategies whose processes start from the launching one, which keeps no trained
student to export (it ended in an ``AttributeError`` once training was over)."""


def strategy_name_errors(cfg: Mapping) -> list[str]:
    """``trainer.strategy`` given by name: one Lightning knows, that starts its processes apart
    (the ``strategy`` group's configs give a target instead)."""
    name = lookup(cfg, "trainer.strategy")
    if not isinstance(name, str) or name == "auto":
        return []
    ours = "strategy=ddp trainer.devices=N (or strategy=fsdp, strategy=deepspeed on GPUs)"
    if name not in StrategyRegistry.available_strategies():
        return [f"trainer.strategy={name!r}: not a strategy Lightning knows; use {ours}"]
    if any(kind in name for kind in LAUNCHED_HERE):
        return [
            f"trainer.strategy={name} runs training in processes started from this one, which "
            f"then holds no trained student to check and export; use {ours}"
        ]
    return []


def available(kind: str) -> bool:
    """Whether this machine has the hardware of Lightning's accelerator ``kind``."""
    return AcceleratorRegistry[kind]["accelerator"].is_available()


def any_gpu() -> bool:
    """Whether ``trainer.accelerator=auto`` finds a GPU here."""
    return any(map(available, GPU_KINDS))


def is_count(value: object) -> bool:
    """A process count: an int >= 1, or -1 (every device)."""
    return isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == -1)


def is_index_list(value: object) -> bool:
    """A non-empty list of distinct device indices (ints >= 0)."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        return False
    indices = list(value)
    valid = all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices)
    return valid and len(set(indices)) == len(indices)
