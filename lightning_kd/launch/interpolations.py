"""Interpolations that resolve to nothing: ``data.batch_size=${data.nonexist}``, a resolver
that does not exist (``${foo:1}``), a value that points at a ``???`` one.

OmegaConf resolves a value when it is read, so such a value failed wherever the first check
read it, as a traceback with exit 1 (probe 37). Each is named here, with the key it sits in
and the keys nearest to the one it names, before any other check reads the config.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    GrammarParseError,
    InterpolationKeyError,
    InterpolationResolutionError,
    InterpolationToMissingValueError,
    UnsupportedInterpolationType,
)

from lightning_kd.launch.config import dotted_keys

UNRESOLVED = (
    InterpolationKeyError,
    UnsupportedInterpolationType,
    InterpolationToMissingValueError,
    GrammarParseError,
)
"""What a user's interpolation can get wrong. Others (a resolver refusing its value, Hydra's
``${hydra:...}`` outside a launch) are left to the checks of the value they read."""


def interpolation_errors(cfg: DictConfig, argv: Sequence[str] = ()) -> list[str]:
    """One message per key of ``cfg`` (Hydra's own node aside) whose interpolation does not
    resolve; a key that only repeats such a one (``${data.batch_size}``) is named through it.
    ``argv``: the command line, whose ``~key`` may have removed what the key names."""
    keys = [key for key in dotted_keys(cfg) if key != "hydra" and not key.startswith("hydra.")]
    errors = []
    for key in keys:
        raw = _raw(cfg, key)
        if not isinstance(raw, str) or "${" not in raw:
            continue
        try:
            OmegaConf.select(cfg, key, throw_on_resolution_failure=True, throw_on_missing=False)
        except UNRESOLVED as error:
            if (message := _message(key, raw, error, keys, argv)) is not None:
                errors.append(message)
        except InterpolationResolutionError:
            continue  # a resolver's own refusal, or ${hydra:...} outside a launch: not ours
    return errors


def _raw(cfg: DictConfig, key: str) -> object:
    """The text of ``key``'s value before interpolation."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    if not OmegaConf.is_config(node):
        return None
    child = node._get_node(int(leaf) if OmegaConf.is_list(node) else leaf)
    return None if child is None else child._value()


def _message(
    key: str, raw: str, error: Exception, keys: list[str], argv: Sequence[str] = ()
) -> str | None:
    """What is wrong with ``key: raw``, and the fix; None where the failure is another key's
    (``raw`` does not name what failed)."""
    text = str(error).splitlines()[0]
    if isinstance(error, InterpolationKeyError):
        missing = re.search(r"Interpolation key '([^']+)' not found", text)
        name = missing.group(1) if missing else ""
        if name and name not in raw:
            return None
        near = difflib.get_close_matches(name, [k for k in keys if k != key], n=3, cutoff=0.6)
        if near and difflib.SequenceMatcher(None, name, near[0]).ratio() >= 0.9:
            near = near[:1]  # a typo of one key: that key alone
        hint = f"did you mean {' or '.join(near)}?" if near else "name a key the config has"
        if removed := removal_of(name, argv):  # '~distill': keys the config reads (probe 52)
            hint = (
                f"{removed} removed it, and {key} reads it: give the setting another value "
                f"(e.g. {name}=<value>) rather than removing its node"
            )
        return f"{key}={raw}: the config has no key {name!r} to interpolate; {hint}"
    if isinstance(error, UnsupportedInterpolationType):
        resolver = text.rsplit(" ", 1)[-1]
        if f"${{{resolver}:" not in raw or resolver == "hydra":  # Hydra's, set in a launch
            return None
        return (
            f"{key}={raw}: no resolver {resolver!r} is registered (OmegaConf's: oc.env, "
            "oc.select, ...; this package's: kd.*); write the value, or a ${other.key}"
        )
    if isinstance(error, InterpolationToMissingValueError):
        return f"{key}={raw}: it names a key without a value (???); set that key"
    return f"{key}={raw}: {text}; write the interpolation as ${{some.key}}"


def removal_of(name: str, argv: Sequence[str]) -> str | None:
    """The ``~key`` override of ``argv`` that removed ``name`` (or a node holding it), if one."""
    for word in argv:
        removed = word[1:].split("=", 1)[0] if word.startswith("~") else None
        if removed and (name == removed or name.startswith(f"{removed}.")):
            return word
    return None
