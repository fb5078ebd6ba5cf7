"""``group=option`` overrides naming no option of their group, refused before Hydra composes.

Hydra's own refusal of ``teacher=tiny_lama`` is its "Could not find 'teacher/tiny_lama'" with the
config search path, exit 1. Here it is one line, exit 2 as for any refused input, with the
nearest option and the group's options: those of the shipped configs and of each
``--config-dir`` (a user's own options count). Hydra's own groups (``hydra/...``) stay Hydra's.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path

from lightning_kd.launch.config_dir import group_options


def group_option_errors(
    argv: Sequence[str], conf_dirs: Sequence[Path], stored: Mapping[str, set[str]] | None = None
) -> list[str]:
    """One message per option of a ``group=option`` (``+group=[a,b]``) override in ``argv``
    that no directory of ``conf_dirs`` holds, nor ``stored`` (each group's nodes registered in
    code: ``<group>/base``, ``data/chat_base``), which the refusal does not offer."""
    stored = stored or {}
    groups: dict[str, set[str]] = {group: set() for group in stored}
    for conf in conf_dirs:
        for group, options in group_options(conf).items():
            groups.setdefault(group, set()).update(options)
    errors = []
    for word in argv:
        key, equals, value = word.lstrip("+").partition("=")
        group = key.partition("@")[0]  # group@package=option
        if not equals or group.startswith("hydra/") or group not in groups:
            continue
        for option in listed(value):
            if option not in groups[group] | stored.get(group, set()):
                errors.append(option_error(word, key, option, sorted(groups[group])))
    return errors


def listed(value: str) -> list[str]:
    """The plain option names of an override's value (``a``, ``[a,b]``, a sweep's ``a,b``); none
    for what Hydra resolves itself (null, an interpolation, ``choice(...)``, a quoted value)."""
    inner = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    names = [name.strip() for name in inner.split(",") if name.strip()]  # (a,b: a sweep's)
    plain = all(name.replace("_", "").replace("-", "").replace("/", "").isalnum() for name in names)
    return names if plain and value != "null" else []


def option_error(word: str, key: str, option: str, options: list[str]) -> str:
    """The line refusing ``option`` of the group ``key`` names, with the nearest of
    ``options`` (written as ``word`` writes its key: ``+callbacks=``)."""
    group = key.partition("@")[0]
    near = difflib.get_close_matches(option, options, n=1)
    typed = word[: len(word) - len(word.lstrip("+"))] + key
    guess = f"did you mean {typed}={near[0]}? " if near else ""
    return f"{word}: the config group {group} has no option {option!r}; {guess}(its options: " + (
        f"{', '.join(options)})"
    )
