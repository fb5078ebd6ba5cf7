"""Top-level keys nothing reads: ``+seeed=3`` (``seed`` mistyped) composed, trained with seed 0,
and exited 0 (probe 52). Hydra adds any key with ``+``; a key of a group node is checked against
the object the group builds (``keys.py``), and a top-level key the shipped config has is read by
name, but one of the user's own is read only by an interpolation (``${my_lr}``). A top-level key
added on the command line that the shipped config lacks and no interpolation names is refused,
with the nearest key it has.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from lightning_kd.launch.config import compose_unchecked


@functools.cache
def shipped_keys() -> frozenset[str]:
    """The top-level keys of the shipped config, composed with no override."""
    return frozenset(str(key) for key in compose_unchecked([]))


def unread_top_key_errors(cfg: Mapping, overrides: Sequence[str]) -> list[str]:
    """One message per top-level key added by one of ``overrides`` (``+key=value``) that the
    shipped config lacks and no interpolation of ``cfg`` (the config they composed) reads. A
    key of a YAML file of the user's own (a note) is theirs to keep."""
    if not isinstance(cfg, DictConfig):
        return []
    keys = [word.lstrip("+").split("=", 1)[0] for word in overrides if word.startswith("+")]
    # +distil.temperature=2 (distill mistyped) adds a node: its first part is the key added.
    tops = {key: key.split(".", 1)[0] for key in keys if "/" not in key}  # not a group's option
    added = {key: top for key, top in tops.items() if top not in {*shipped_keys(), "hydra"}}
    if not added:
        return []
    text = OmegaConf.to_yaml(cfg, resolve=False)  # interpolations as written
    errors = []
    for key, top in added.items():
        if re.search(r"\$\{\s*" + re.escape(top) + r"\s*[.}\[]", text):
            continue  # the user's own, read by an interpolation
        near = difflib.get_close_matches(top, sorted(shipped_keys()), n=1, cutoff=0.7)
        hint = f"did you mean {near[0]}?" if near else "nothing reads a key of its own"
        errors.append(
            f"+{key}: the config has no key {top!r}, and nothing reads it; {hint} (a key of "
            f"your own is read where an interpolation names it: ${{{top}}})"
        )
    return errors
