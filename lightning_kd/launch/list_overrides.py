"""Overrides of a list's entries that Hydra cannot merge (``teachers.2.weight=0.1``,
``'teachers.1={name: x, path: gemma3_270m}'``), refused with what is wrong and the fix.

Hydra merges a mapping given for a list entry into that entry, and sets an entry's key only where
the entry exists. An entry past the list's end was "Error merging override ... list index out of
range", exit 1; a mapping with a key the entry lacks was read as a key the config does not have
("the config has no key teachers.1; did you mean teachers.1?", probe 40).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from omegaconf import ListConfig, OmegaConf
from omegaconf.errors import ConfigIndexError, ConfigKeyError

ITEM = re.compile(r"full_key: ([\w.]+)\[(\d+)\](?:\.(\w+))?\s")
"""omegaconf's name of a list entry (``teachers[2]``) or an entry's key (``teachers[1].path``)."""


def list_override_error(
    error: Exception, overrides: Sequence[str], compose: Callable[[list[str]], object]
) -> str | None:
    """Why an override of a list's entry in ``overrides`` could not be merged (``error``,
    Hydra's), with the fix; None for another failure. ``compose`` composes overrides (to count
    the list's entries without the one refused)."""
    cause = error.__cause__
    if not isinstance(cause, ConfigIndexError | ConfigKeyError):
        return None
    found = ITEM.search(f"{cause}\n")
    if found is None:
        return None
    name, index, key = found.group(1), int(found.group(2)), found.group(3)
    word = next((w for w in overrides if names_entry(w, name, index)), None)
    if word is None:
        return None
    whole = f"give the whole list, {name}=[{{...}}, ...] (lightning-kd train --cfg job prints it)"
    if isinstance(cause, ConfigKeyError) and key is not None:
        return (
            f"{word}: a mapping given for {name}.{index} is merged into that entry, which has no "
            f"key {key!r}; add it with +{name}.{index}.{key}=VALUE, or {whole}"
        )
    entries = count(compose([w for w in overrides if w != word]), name)
    held = f"its entries are {name}.0 to {name}.{entries - 1}" if entries else "it has none"
    return (
        f"{word}: {name} has no entry {index} ({held}), and Hydra neither sets nor appends a "
        f"list's entry past its end by index; {whole}"
    )


def names_entry(word: str, name: str, index: int) -> bool:
    """Whether the override ``word`` sets entry ``index`` of ``name`` or one of its keys:
    ``teachers.1=...`` and ``teachers.1.path=...``, not ``teachers.10=...``."""
    return re.match(rf"{re.escape(name)}\.{index}(?:[.=]|$)", word.lstrip("+~")) is not None


def count(cfg: object, name: str) -> int:
    """How many entries the list ``name`` of ``cfg`` holds (0 for none, or no list)."""
    found = OmegaConf.select(cfg, name, throw_on_resolution_failure=False)
    return len(found) if isinstance(found, ListConfig) else 0
