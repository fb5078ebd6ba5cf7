"""Keys a config does not have: a mistyped override, and a setting nothing reads.

Hydra refuses ``distill.kdweight=0.3`` with "To append to your config use +distill.kdweight=0.3";
followed, that advice ends in a ``TypeError`` from the object the group builds, after the data
has been read. Both are refused here, before anything loads, each with the key it was likely
meant to be.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from hydra.errors import ConfigCompositionException
from hydra.utils import get_object

from lightning_kd.distill.teacher_entries import ENTRY_KEYS
from lightning_kd.launch.config import (
    CONF_DIR,
    GROUP_TARGETS,
    NOT_IN_CONFIG,
    compose_unchecked,
    dotted_keys,
)
from lightning_kd.launch.config_dir import CONFIG_DIR_FLAGS
from lightning_kd.launch.defaults_lists import (
    GLOBAL_GROUPS,
    late_override_error,
    packaged_default_error,
)
from lightning_kd.launch.list_overrides import list_override_error
from lightning_kd.launch.other_options import unknown_key_fix
from lightning_kd.launch.top_keys import unread_top_key_errors
from lightning_kd.models.loading import StudentSpec, TeacherSpec

HYDRA_KEYS = {"_target_", "_convert_", "_recursive_", "_partial_", "_args_"}
"""Keys ``hydra.utils.instantiate`` reads itself: never a setting of the object built."""

PRINT_FLAGS = ("--cfg", "-c")
"""Hydra's flags that print the composed config (with a value: job, hydra, all)."""


def override_key_errors(argv: Sequence[str]) -> list[str]:
    """One message per override in the command line ``argv`` that sets a key the composed
    config does not have, each with the nearest key it has, and per setting nothing reads
    (:func:`unknown_setting_errors`, ``top_keys.py``); or one per ``--config-dir`` that is not a
    directory. Command lines with other flags than ``--config-dir`` (``-m``, ``--cfg``,
    ``--help``) are left to Hydra, as are sweeps."""
    split = _overrides_and_dirs(argv)
    if split is None:
        return []
    overrides, config_dirs = split
    if absent := [d for d in config_dirs if not Path(d).expanduser().is_dir()]:
        # Hydra only warns, then composes without it: the user's configs would go unread.
        return [f"--config-dir {d}: no such directory" for d in absent]
    missing: list[tuple[str, str]] = []
    cfg = None
    for _ in range(len(overrides) + 1):
        try:
            cfg = compose_unchecked(overrides, config_dirs=config_dirs)
            break
        except ConfigCompositionException as error:
            compose = functools.partial(compose_unchecked, config_dirs=config_dirs)
            if listed := list_override_error(error, overrides, compose):
                return [listed]
            found = NOT_IN_CONFIG.search(str(error))
            if found and (packaged := packaged_default_error(found.group(1))):
                return [packaged]
            if late := late_override_error(str(error)):
                return [late]
            word = _override_of(overrides, found.group(1)) if found else None
            if word is None:  # another problem: Hydra names it when it composes
                break
            if (unset := unset_group_error(word, found.group(1), config_dirs)) is not None:
                return [unset]
            missing.append((word, found.group(1)))
            overrides = [w for w in overrides if w != word]
        except yaml.YAMLError as error:  # a file of one's own: Hydra's traceback (probe 52)
            return [f"a config file is not valid YAML ({error}); fix the file it names"]
        except Exception:  # a sweep, a missing group option: Hydra's own message says it
            break
    keys = [] if cfg is None else dotted_keys(cfg)
    errors = [_missing_message(word, key, keys) for word, key in missing]
    if cfg is None:
        return errors
    return errors + unknown_setting_errors(cfg) + unread_top_key_errors(cfg, overrides)


def unset_group_error(word: str, key: str, config_dirs: Sequence[str]) -> str | None:
    """``callbacks=early_stopping``: a group the defaults list leaves unset is added with ``+``
    (the message said: the config has no key ``callbacks``, "did you mean callbacks?")."""
    dirs = [CONF_DIR, *(Path(d).expanduser() for d in config_dirs)]
    if word.startswith("+") or not any((d / key).is_dir() for d in dirs):
        return None
    return (
        f"{word}: the config chooses no {key} option by default, so there is none to "
        f"replace; add it with +{word} (several at once: '+{key}=[a,b]')"
    )


def unknown_setting_errors(cfg: Mapping) -> list[str]:
    """One message per key of a group node (``distill``, ``data``, ...) that the object it
    builds takes no argument for: ``+distill.kdweight=0.3``, or a typo in a user's YAML file;
    and per option of a global group whose settings nothing reads."""
    errors = global_group_errors(cfg)
    for group in (*GROUP_TARGETS, *BUILT_GROUPS):
        node = cfg.get(group) if isinstance(cfg, Mapping) else None
        if not isinstance(node, Mapping) or not isinstance(node.get("_target_"), str):
            continue
        parameters = _parameters(node["_target_"])
        if parameters is None:  # not found: ``instantiate`` names it then
            continue
        errors += flag_errors(group, node, parameters)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue  # it takes any keyword
        accepted = list(parameters)
        for key in node:
            if key in HYDRA_KEYS or key in accepted:
                continue
            fix = unknown_key_fix(group, str(key), accepted)
            name = node["_target_"].rsplit(".", 1)[-1]
            errors.append(f"{group}.{key}: {name} takes no setting {key!r}; {fix}")
    return errors


BUILT_GROUPS = ("trainer", "optimizer", "scheduler")
"""Nodes built from their ``_target_`` by the run (Lightning's Trainer, a torch optimizer, a
schedule): ``+trainer.foo=1`` was a ``TypeError`` once the data had been read."""

FLAG_TYPES = {"bool": False, "bool | None": True}
"""The annotations of a yes/no setting, and whether it may be null."""


def flag_errors(
    group: str, node: Mapping, parameters: Mapping[str, inspect.Parameter]
) -> list[str]:
    """A yes/no setting of a group node (its object takes ``parameters``) given something else:
    ``data.pack=flase`` stayed a string, which is true, so packing stayed on;
    ``activation_checkpointing=nope`` turned it on."""
    errors = []
    for key, parameter in parameters.items():
        nullable = FLAG_TYPES.get(str(parameter.annotation))
        if nullable is None:  # read no other value: trainer.default_root_dir needs Hydra's
            continue
        value = node.get(key, True)  # a key left out takes its default
        if isinstance(value, bool) or (nullable and value is None):
            continue
        allowed = "true, false or null" if nullable else "true or false"
        errors.append(f"{group}.{key}={value!r}: give {allowed}, e.g. {group}.{key}=true")
    return errors


def global_group_errors(cfg: Mapping) -> list[str]:
    """An ``experiment``/``debug`` option whose settings landed under the group's own key."""
    errors = []
    for group in GLOBAL_GROUPS:
        node = cfg.get(group) if isinstance(cfg, Mapping) else None
        if isinstance(node, Mapping) and len(node):
            keys = ", ".join(f"{group}.{key}" for key in list(node)[:3])
            errors.append(
                f"the {group} option's settings landed under {group} ({keys}), where nothing "
                f"reads them; make '# @package _global_' its file's first line, as in the "
                f"shipped {CONF_DIR / group}/*.yaml"
            )
    return errors


def _overrides_and_dirs(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """``argv``'s overrides and ``--config-dir`` directories, or None for another flag."""
    overrides, config_dirs, words = [], [], iter(argv)
    for word in words:
        if word in CONFIG_DIR_FLAGS:
            config_dirs.append(next(words, ""))
        elif word in PRINT_FLAGS:  # `--cfg job` prints the config the overrides compose
            next(words, "")
        elif word == "--resolve":
            continue
        elif word.startswith("--config-dir="):
            config_dirs.append(word.split("=", 1)[1])
        elif word.startswith("-"):
            return None
        else:
            overrides.append(word)
    return overrides, config_dirs


def _override_of(overrides: Sequence[str], key: str) -> str | None:
    """The last of ``overrides`` that sets ``key`` (as typed), or None."""
    matches = [w for w in overrides if w.split("=", 1)[0].lstrip("+~") == key]
    return matches[-1] if matches else None


def _missing_message(word: str, key: str, keys: Sequence[str]) -> str:
    """Why ``word`` is refused, with the nearest of ``keys``: among the keys beside it where
    its parent exists (``trainer.maxsteps``), else among those as deep (``distil.kd_weight``)."""
    parent = _parent(key)
    if ENTRY.fullmatch(key) and key.rsplit(".", 1)[1] in entry_keys():
        return (
            f"{word}: this teachers entry does not set {key.rsplit('.', 1)[1]}, which an entry "
            f"may have: add it with +{word}"
        )
    siblings = [k for k in keys if _parent(k) == parent]
    if parent is not None and parent not in keys:
        siblings = [k for k in keys if k.count(".") == key.count(".")]
    if parent in keys and FREE_FORM.fullmatch(parent):
        return _free_form_message(word, key, siblings)
    near = difflib.get_close_matches(key, siblings, n=1, cutoff=0.7)
    if near:
        return f"{word}: the config has no key {key}; did you mean {near[0]}?"
    return (
        f"{word}: the config has no key {key}; lightning-kd train --cfg job prints the keys "
        f"it has (a key it leaves out that the object built takes is added with +{word})"
    )


ENTRY = re.compile(r"teachers\.\d+\.\w+")
"""A key of one ``teachers`` entry (``teachers.1.cache``)."""


def _free_form_message(word: str, key: str, siblings: Sequence[str]) -> str:
    """``teacher.config.rope_theta=5000``: a key such a node may well take, or a typo of one it
    lists (matched by name alone, as their shared prefix made any two look alike)."""
    parent, name = key.rsplit(".", 1)
    names = [k.rsplit(".", 1)[1] for k in siblings if _parent(k) == parent]
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    guess = f"did you mean {parent}.{near[0]}? If not, " if near else ""
    return (
        f"{word}: {parent} lists only some of the keys it may take; {guess}add one it does "
        f"not list with +{word} (a key it does not take is named when the run loads)"
    )


def _free_form_fields(spec: type) -> str:
    """``spec``'s fields that hold a mapping of any keys (a model config, LoRA settings)."""
    names = [f.name for f in dataclasses.fields(spec) if str(f.type).startswith("dict[str, Any]")]
    return "|".join(names)


FREE_FORM = re.compile(
    rf"(teacher|teachers\.\d+)\.({_free_form_fields(TeacherSpec)})"
    rf"|student\.({_free_form_fields(StudentSpec)})"
)
"""A node of any keys (``teacher.config``): one it does not list yet is no typo on its face
(``teacher.config.rope_theta``), and the model's config class names a wrong one when it loads."""


def entry_keys() -> list[str]:
    """What a ``teachers`` entry may set (``distill/teacher_entries.py``)."""
    return [*ENTRY_KEYS, *(field.name for field in dataclasses.fields(TeacherSpec))]


def _parent(key: str) -> str | None:
    return key.rsplit(".", 1)[0] if "." in key else None


def _parameters(target: str) -> Mapping[str, inspect.Parameter] | None:
    """The parameters ``target`` (a dotted path) takes, or None where it cannot be found."""
    try:
        return inspect.signature(get_object(target)).parameters
    except Exception:
        return None
