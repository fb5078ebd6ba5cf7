"""Why Hydra could not apply an option's defaults list, in words that name the file and the
fix: Hydra's own messages ("Could not override 'debug'. Did you mean to override debug?") name
neither. ``keys.py`` asks these of a composition error before anything loads."""

from __future__ import annotations

import re

from lightning_kd.launch.config import CONF_DIR

GLOBAL_GROUPS = ("experiment", "debug")
"""Groups whose options set keys all over the config (``# @package _global_``): a file of theirs
without that line lands under the group's key (``experiment.trainer.max_steps``), unread."""


def packaged_default_error(target: str) -> str | None:
    """Why Hydra could not apply ``target`` (``data@experiment.data``): a default a global
    group's file overrides, in a file without ``# @package _global_``, composed under the
    group's key. Hydra's "Did you mean to override data?" names neither the file nor the fix."""
    group, _, package = target.partition("@")
    owner = package.split(".", 1)[0]
    if owner not in GLOBAL_GROUPS or not group:
        return None
    return (
        f"the {owner} option overrides /{group} in its defaults list, and its file lacks "
        f"'# @package _global_': the override lands under {owner} ({target}), which Hydra "
        f"refuses; make '# @package _global_' its file's first line, as in the shipped "
        f"{CONF_DIR / owner}/*.yaml"
    )


LATE_OVERRIDE = re.compile(r"In '(\w+)/([^']+)': Could not override '(\w+)'")


def late_override_error(message: str) -> str | None:
    """Why Hydra could not apply an option's ``override /debug: smoke``: conf/config.yaml's
    defaults list puts that group after the option's (``debug`` last, to shrink any experiment),
    and a defaults list overrides only the groups before it. Hydra said "Could not override
    'debug'. Did you mean to override debug?" (probe 37)."""
    found = LATE_OVERRIDE.search(message)
    if found is None or found.group(3) not in GLOBAL_GROUPS[1:] or found.group(1) == "debug":
        return None
    owner, option, group = found.groups()
    return (
        f"{owner}/{option} overrides /{group} in its defaults list, which the shipped "
        f"config.yaml composes after {owner} (so that {group}=... applies over any {owner}): "
        f"an {owner} cannot set it; drop that line and give {group}=... on the command line, "
        f"or copy the {group} settings you need into {owner}/{option}.yaml"
    )
