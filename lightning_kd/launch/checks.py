"""Every numeric config value checked before anything loads: finite, of the right kind, in range.

A bad value found here costs a second; found by the run, it costs a model load, or a whole run
that trains on NaN. Each rule names its key, its allowed range and an example value, and
:func:`check_config` reports every bad key at once, each with the value it got and the fix.
Choices that would fail only after the models load are checked here too: a logger not installed
or a callback that needs one (``logger_checks.py``), an int8 teacher where it cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_kd.launch.logger_checks import logger_errors
from lightning_kd.models.quantize import STRATEGIES, backend_errors

_ABSENT = object()


@dataclass(frozen=True)
class Number:
    """The allowed values of one numeric config key."""

    low: float | None = None
    """Smallest allowed value (None: no lower bound)."""
    high: float | None = None
    """Largest allowed value (None: no upper bound)."""
    low_open: bool = False
    """Whether ``low`` itself is excluded."""
    high_open: bool = False
    """Whether ``high`` itself is excluded."""
    integer: bool = False
    """Whether the value must be a whole number."""
    nullable: bool = False
    """Whether null is allowed (it means "automatic" or "off" for the key)."""
    special: tuple[float, ...] = ()
    """Values allowed outside the range, with their own meaning (-1 = unlimited, ...)."""
    example: str = ""
    """A valid value to suggest in the error."""

    def describe(self) -> str:
        """The allowed range in words, e.g. ``an integer >= 1`` or ``a number in (0, 1]``."""
        kind = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{_fmt(self.low)}, {_fmt(self.high)}{right}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_fmt(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_fmt(self.high)}"
        else:
            text = kind
        extras = [_fmt(value) for value in self.special] + (["null"] if self.nullable else [])
        return text + (f" (or {', '.join(extras)})" if extras else "")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is allowed."""
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False  # true/false and strings are not numbers, whatever YAML makes of them
        if value in self.special:
            return True
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        if self.integer and isinstance(value, float):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (
            value > self.high or (self.high_open and value == self.high)
        )


@dataclass(frozen=True)
class CountOrFraction:
    """A Trainer ``limit_*``/``val_check_interval`` value: a batch count or a fraction of them."""

    nullable: bool = True
    example: str = "1.0"

    def describe(self) -> str:
        return "an integer >= 1 (batches) or a number in (0, 1] (a fraction of them)" + (
            " (or null)" if self.nullable else ""
        )

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if isinstance(value, bool):
            return False
        if isinstance(value, int):
            return value >= 1
        return isinstance(value, float) and math.isfinite(value) and 0.0 < value <= 1.0


POSITIVE = Number(low=0, low_open=True)
NON_NEGATIVE = Number(low=0)
COUNT = Number(low=1, integer=True)

RULES: dict[str, Number | CountOrFraction] = {
    "seed": Number(integer=True, example="0"),
    "optimizer.lr": Number(low=0, low_open=True, example="1e-3"),
    "optimizer.weight_decay": Number(low=0, example="0.01"),
    "optimizer.eps": Number(low=0, low_open=True, example="1e-8"),
    "optimizer.momentum": Number(low=0, high=1, high_open=True, example="0.9"),
    "scheduler.warmup_fraction": Number(low=0, high=1, high_open=True, example="0.05"),
    "scheduler.final_lr_fraction": Number(low=0, high=1, example="0.1"),
    "distill.temperature": Number(low=0, low_open=True, example="1.0"),
    "distill.kd_weight": Number(low=0, example="0.5"),
    "distill.ce_weight": Number(low=0, example="0.5"),
    "distill.feature_weight": Number(low=0, example="1.0"),
    "distill.beta": Number(low=0, high=1, example="0.5"),
    "distill.skew": Number(low=0, high=1, high_open=True, example="0.1"),
    "distill.chunk_size": Number(low=1, integer=True, nullable=True, example="null"),
    "distill.on_policy": Number(low=0, high=1, example="0.5"),
    "distill.on_policy_tokens": Number(low=1, integer=True, example="128"),
    "distill.on_policy_temperature": Number(low=0, low_open=True, example="1.0"),
    "distill.on_policy_teacher_top_k": Number(low=1, integer=True, nullable=True, example="25"),
    "distill.blockwise_passes": Number(low=0, integer=True, example="3"),
    "distill.blockwise_lr": Number(low=0, low_open=True, example="1e-3"),
    "cache.k": Number(low=1, integer=True, example="32"),
    "cache.temperature": Number(low=0, low_open=True, example="1.0"),
    "cache.shard_blocks": Number(low=1, integer=True, example="64"),
    "cache.batch_size": Number(low=1, integer=True, example="8"),
    "data.block_size": Number(low=2, integer=True, example="256"),
    "data.batch_size": Number(low=1, integer=True, example="4"),
    "data.val_batch_size": Number(low=1, integer=True, nullable=True, example="8"),
    "data.val_fraction": Number(low=0, high=1, low_open=True, high_open=True, example="0.05"),
    "data.max_train_examples": Number(low=1, integer=True, nullable=True, example="180"),
    "data.num_workers": Number(low=0, integer=True, example="0"),
    "student.num_layers": Number(low=1, integer=True, nullable=True, example="6"),
    "student.calibration_blocks": Number(low=1, integer=True, example="4"),
    "teacher.init_seed": Number(integer=True, example="0"),
    "trainer.max_steps": Number(low=1, integer=True, special=(-1,), example="140"),
    "trainer.max_epochs": Number(low=1, integer=True, nullable=True, special=(-1,), example="1"),
    "trainer.accumulate_grad_batches": Number(low=1, integer=True, example="1"),
    "trainer.val_check_interval": CountOrFraction(example="100"),
    "trainer.check_val_every_n_epoch": Number(low=1, integer=True, nullable=True, example="1"),
    "trainer.limit_train_batches": CountOrFraction(),
    # 0 would switch validation off, but the run validates after training to report the student.
    "trainer.limit_val_batches": CountOrFraction(),
    "trainer.log_every_n_steps": Number(low=1, integer=True, example="5"),
    "trainer.gradient_clip_val": Number(low=0, nullable=True, example="1.0"),
    "trainer.num_sanity_val_steps": Number(low=-1, integer=True, example="0"),
    "trainer.num_nodes": Number(low=1, integer=True, example="1"),
    "checkpoint.every": Number(low=1, integer=True, example="50"),
}
"""Every numeric key a run reads, by dotted path; a key a config does not have is skipped."""


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def lookup(cfg: Mapping, dotted: str) -> Any:
    """``cfg``'s value at ``a.b.c``, or ``_ABSENT`` where a part of the path is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def config_errors(cfg: Mapping) -> list[str]:
    """One message per bad numeric value in ``cfg`` (empty when all are fine)."""
    errors = []
    for key, rule in RULES.items():
        value = lookup(cfg, key)
        if value is _ABSENT or rule.accepts(value):
            continue
        fix = f"; e.g. {key}={rule.example}" if rule.example else ""
        errors.append(f"{key}={value!r}: must be {rule.describe()}{fix}")
    errors += _list_errors(cfg) + _device_errors(cfg) + _encoder_errors(cfg)
    errors += _quantize_errors(cfg) + logger_errors(cfg) + _sharding_errors(cfg)
    return errors + _repair_errors(cfg)


def _encoder_errors(cfg: Mapping) -> list[str]:
    if lookup(cfg, "teacher.task") == "encoder" and not lookup(cfg, "distill.features"):
        return [
            "teacher.task=encoder with distill.features unset: an encoder has no logits, so "
            "feature matching is the whole objective; e.g. distill.features=uniform"
        ]
    return []


def _quantize_errors(cfg: Mapping) -> list[str]:
    mode = lookup(cfg, "teacher.quantize")
    if mode is _ABSENT or mode is None:
        return []
    accelerator = lookup(cfg, "trainer.accelerator")
    accelerator = None if accelerator is _ABSENT else accelerator
    return backend_errors(mode, accelerator, _strategy_target(cfg))


def _strategy_target(cfg: Mapping) -> str | None:
    """``trainer.strategy``'s name or ``_target_`` (None when unset)."""
    strategy = lookup(cfg, "trainer.strategy")
    if isinstance(strategy, Mapping):
        strategy = strategy.get("_target_")
    return None if strategy is _ABSENT else strategy


SHARDED_REFUSALS = {
    "distill.on_policy": "ranks sample completions of different lengths, and each generated "
    "token of a sharded student is a collective",
    "distill.blockwise_passes": "the repair trains whole student layers outside the sharded step",
}


def _sharding_errors(cfg: Mapping) -> list[str]:
    if not any(kind in str(_strategy_target(cfg)).lower() for kind in STRATEGIES):
        return []
    return [
        f"{key} with a sharding strategy: {why}; use strategy=ddp (or {key}=0)"
        for key, why in SHARDED_REFUSALS.items()
        if isinstance(value := lookup(cfg, key), int | float) and value > 0
    ]


def _repair_errors(cfg: Mapping) -> list[str]:
    passes = lookup(cfg, "distill.blockwise_passes")
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        return []
    return [
        f"distill.blockwise_passes={passes} with {key} set: the repair trains whole layers "
        "copied from the teacher (student.num_layers or student.layers); set "
        "distill.blockwise_passes=0"
        for key in ("student.path", "student.config", "student.lora")
        if lookup(cfg, key) not in (None, _ABSENT)
    ]


def _list_errors(cfg: Mapping) -> list[str]:
    betas = lookup(cfg, "optimizer.betas")
    rule = Number(low=0, high=1, high_open=True)
    if betas is _ABSENT or betas is None:
        return []
    if (
        isinstance(betas, str)
        or not isinstance(betas, Sequence)
        or len(betas) != 2
        or not all(map(rule.accepts, betas))
    ):
        return [f"optimizer.betas={betas!r}: must be two numbers in [0, 1); e.g. [0.9, 0.95]"]
    return []


def _device_errors(cfg: Mapping) -> list[str]:
    devices = lookup(cfg, "trainer.devices")
    if isinstance(devices, bool) or (isinstance(devices, int) and devices < 1 and devices != -1):
        return [
            f"trainer.devices={devices!r}: must be an integer >= 1 (or -1 for all, or auto); "
            "e.g. trainer.devices=1"
        ]
    return []


def check_config(cfg: Mapping) -> None:
    """Raise ``ValueError`` listing every numeric config value that is out of range."""
    errors = config_errors(cfg)
    if errors:
        head = "a config value is" if len(errors) == 1 else f"{len(errors)} config values are"
        raise ValueError(f"{head} out of range:\n  " + "\n  ".join(errors))
