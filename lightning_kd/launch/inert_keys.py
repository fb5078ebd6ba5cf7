"""Settings of one mode given while that mode is off: ``data.val_size`` without
``data.streaming`` (validation stayed the ``data.val_fraction`` split), ``distill.on_policy_tokens``
without ``distill.on_policy``, ``distill.blockwise_lr`` without a repair. Each was accepted and did
nothing, without a word (probe 55); now a warning before anything loads names the key and the
mode it belongs to. Not a refusal: a config file of one's own may set them for a mode another
override turns off."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from lightning_kd.launch.rules import lookup

MODES = {
    "data.streaming": (
        "streamed data",
        "data.streaming=true",
        "; read whole, data.val_fraction holds out the validation split",
    ),
    "distill.on_policy": ("on-policy KD", "distill.on_policy > 0", ""),
    "distill.blockwise_passes": ("the block-wise repair", "distill.blockwise_passes > 0", ""),
}
"""Each mode's switch: what it is, how it is turned on, and what holds without it."""
INERT = {
    "data.val_size": "data.streaming",
    "data.shuffle_buffer": "data.streaming",
    "distill.on_policy_tokens": "distill.on_policy",
    "distill.on_policy_temperature": "distill.on_policy",
    "distill.on_policy_warmup": "distill.on_policy",
    "distill.on_policy_seed": "distill.on_policy",
    "distill.blockwise_lr": "distill.blockwise_passes",
    "cache.keep_repair_states": "distill.blockwise_passes",
}
"""Each key that only its mode reads, by the switch of that mode."""


def defaults() -> dict[str, Any]:
    """The default of each :data:`INERT` key, where it is written once: the data module's
    arguments, ``DistillConfig``'s and ``CacheSpec``'s fields."""
    from lightning_kd.cache.format import CacheSpec
    from lightning_kd.data.text import TextDataModule
    from lightning_kd.distill.objective import DistillConfig

    data = inspect.signature(TextDataModule.__init__).parameters
    groups = {
        "data": {name: value.default for name, value in data.items()},
        "distill": {field.name: field.default for field in dataclasses.fields(DistillConfig)},
        "cache": {field.name: field.default for field in dataclasses.fields(CacheSpec)},
    }
    return {key: groups[key.split(".")[0]][key.split(".", 1)[1]] for key in INERT}


def inert_notes(cfg: Mapping) -> list[str]:
    """A line for each :data:`INERT` key set to other than its default while its mode is off."""
    notes, default = [], defaults()
    for key, mode in INERT.items():
        value = lookup(cfg, key)
        if value != default[key] and not lookup(cfg, mode):
            what, switch, instead = MODES[mode]
            value = str(value).lower() if isinstance(value, bool) else value  # as typed
            notes.append(
                f"{key}={value} does nothing in this run: only {what} reads it ({switch})"
                f"{instead}; drop it, or turn {what} on"
            )
    return notes
