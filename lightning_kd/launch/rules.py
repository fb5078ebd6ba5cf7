"""The allowed values of one numeric key, and the messages that refuse the others.

Config keys (``data.block_size``) and command options (``--block-size``) are checked by the same
rules (``checks.py``, ``entry.py``), so every refusal reads the same: the key, the value it got,
the allowed range and an example.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lightning_kd.utils.refusal import is_number

ABSENT = object()
"""The value of a key a config does not have (skipped, not refused)."""


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
        if not is_number(value):
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


@dataclass(frozen=True)
class MetricName:
    """A validation metric a callback keeps or stops by: ``val/<name>``, or null (none)."""

    example: str = "val/ppl"

    def describe(self) -> str:
        return "a validation metric, val/<name> (or null)"

    def accepts(self, value: Any) -> bool:
        return value is None or (isinstance(value, str) and value.startswith("val/"))


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def value_errors(
    values: Mapping[str, Any], rules: Mapping[str, Number | CountOrFraction | MetricName]
) -> list[str]:
    """One message per entry of ``values`` (key → value) its rule refuses: the key, the value,
    the allowed range and an example. Config keys and command options (``--block-size``) alike."""
    errors = []
    for key, value in values.items():
        rule = rules[key]
        if value is ABSENT or rule.accepts(value):
            continue
        fix = f"; e.g. {key}={rule.example}" if rule.example else ""
        errors.append(f"{key}={value!r}: must be {rule.describe()}{fix}")
    return errors


def lookup(cfg: Mapping, dotted: str) -> Any:
    """``cfg``'s value at ``a.b.c``, or ``ABSENT`` where a part of the path is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ABSENT
        node = node[part]
    return node


def followed(cfg: Mapping, key: str) -> str | None:
    """The key whose value ``key`` repeats (``cache.temperature: ${distill.temperature}``), or
    None: a bad value is then refused once, by the key the user set."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if isinstance(cfg, DictConfig) and parent else None
    if not isinstance(node, DictConfig) or leaf not in node:
        return None
    raw = node._get_node(leaf)._value()  # the text before interpolation
    found = FOLLOWS.fullmatch(raw) if isinstance(raw, str) else None
    return (found.group(1) or found.group(2)) if found else None


FOLLOWS = re.compile(r"\$\{([\w.]+)\}|\$\{kd\.\w+:\$\{([\w.]+)\}\}")
"""``${key}``, or a ``kd.*`` resolver of it alone
(``${kd.steps_interval:${trainer.max_steps}}``)."""
