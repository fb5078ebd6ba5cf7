"""Which other option of a config group takes a setting the chosen one does not.

``experiment=instruct_onpolicy data=text`` set ``data.completion_field``, a setting of
``data=chat``'s ``ChatDataModule``, and was told "did you mean data.domain_field?" (probe 38):
the nearest name of the wrong class. A setting another option of the group takes is said to be
that option's.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Sequence

from omegaconf import OmegaConf

from lightning_kd.launch.config import VARIANT_TARGETS
from lightning_kd.launch.config_dir import shipped_config_dir


def unknown_key_fix(group: str, key: str, accepted: Sequence[str]) -> str:
    """The fix for ``group.key``, a setting the group's chosen class does not take: the option of
    the group whose class takes it, else the nearest setting it takes, else how to list them."""
    if option := option_taking(group, key):
        return f"it is a setting of {group}={option}: choose {group}={option}, or drop it"
    near = difflib.get_close_matches(key, accepted, n=1)
    if near:
        return f"did you mean {group}.{near[0]}?"
    return f"remove it (lightning-kd train --cfg job prints the {group} keys)"


def option_taking(group: str, key: str) -> str | None:
    """The shipped option of ``group`` built on a variant (``data/chat_base``) whose class takes
    ``key``, or None."""
    for (variant_group, base), target in VARIANT_TARGETS.items():
        if variant_group == group and key in inspect.signature(target).parameters:
            return next(iter(options_on(group, base)), None)
    return None


def options_on(group: str, base: str) -> list[str]:
    """The shipped ``conf/<group>/*.yaml`` options whose defaults list ``base``."""
    found = []
    for path in sorted((shipped_config_dir() / group).glob("*.yaml")):
        defaults = OmegaConf.load(path).get("defaults") or []
        if base in [str(item) for item in defaults]:
            found.append(path.stem)
    return found
