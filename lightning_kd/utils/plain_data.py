"""Specs as plain data and back: what a checkpoint read with ``weights_only=True`` can hold;
plain nested mappings read flat, by dotted keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


def plain_data(value: Any) -> Any:
    """``value`` with every dataclass and mapping a dict and every sequence a list (a Hydra
    ``ListConfig`` included): what a checkpoint read with ``weights_only=True`` can hold."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {key: plain_data(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [plain_data(item) for item in value]
    return value


def as_spec(value: Any, spec: type) -> Any:
    """``value`` as a ``spec`` dataclass (checkpoints store specs as plain dicts)."""
    return value if isinstance(value, spec) else spec(**value)


def flat(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record`` with nested mappings as dotted keys (``data.seed``); other values, lists
    included, as they are."""
    found: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, Mapping):
            found |= flat(value, f"{prefix}{key}.")
        else:
            found[f"{prefix}{key}"] = value
    return found
