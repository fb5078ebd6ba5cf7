"""A model's config from overrides — ``student.config`` over the teacher's, ``teacher.config``
alone — built through its config class, every key checked.

Setting attributes on a copy of the teacher's config took any key: a typo (``hidden_sise``), or a
key of another architecture (``n_layer`` on a Llama), became an attribute nothing reads; a key the
class's constructor turns into another (``rope_theta`` into ``rope_parameters``) did nothing; and
``model_type: gpt2`` left a Llama. Built with ``from_dict``, each key means what it means to the
class, ``model_type`` picks the class, and a key no config of that type has is refused with the
nearest one it has.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig

from lightning_kd.models.layer_config import PER_LAYER

SHARED_WITH_BASE = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")
"""What a config of another model type than its base keeps of it: the tokenizer's side."""


def config_from(
    overrides: Mapping[str, Any], base: PretrainedConfig | None, key: str
) -> tuple[PretrainedConfig | None, list[str]]:
    """The config ``overrides`` (the setting ``key``) describe over ``base`` (None: overrides
    alone, ``model_type`` included), or None and one message per problem."""
    model_type = overrides.get("model_type", getattr(base, "model_type", None))
    if model_type is None:
        return None, [f"{key} needs model_type (e.g. {{model_type: llama, ...}})"]
    # The base's own class: a custom-code teacher's is in no transformers mapping (probe 45)
    own = base is not None and base.model_type == model_type
    if model_type not in CONFIG_MAPPING and not own:
        near = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING), n=1)
        hint = f"did you mean {near[0]}?" if near else "e.g. llama, gpt2"
        return None, [f"{key}.model_type={model_type!r} is not a transformers model type; {hint}"]
    config_class = type(base) if own else CONFIG_MAPPING[model_type]
    values = {k: v for k, v in overrides.items() if k != "model_type"}
    if base is not None and base.model_type == model_type:
        values = without(base.to_dict(), config_class, values) | values
        values = per_layer_derived(values, overrides)
    elif base is not None:
        values = {k: getattr(base, k) for k in SHARED_WITH_BASE if hasattr(base, k)} | values
    try:
        config = config_class.from_dict(values)
    except Exception as error:  # the class's own validation (heads that do not divide the width)
        return None, [f"{key}: {error.__cause__ or error}".replace("\n", " ")]
    errors = unknown_key_errors(values.keys() & overrides.keys(), config, key)
    errors += size_errors(config, key, overrides) or head_errors(config, key)
    return (config, []) if not errors else (None, errors)


def without(base: dict[str, Any], config_class: type, overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` less the keys an override is turned into by the class (``rope_theta`` becomes
    ``rope_parameters``): the base's own value of those would win over the override."""
    default = safe_dict(config_class, {})
    for name, value in overrides.items():
        if name in default:
            continue
        alone = safe_dict(config_class, {name: value})
        base = {k: v for k, v in base.items() if k == name or alone.get(k) == default.get(k)}
    return base


def per_layer_derived(values: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` less the base's per-layer lists (:data:`PER_LAYER`: Gemma's and Qwen's
    ``layer_types``) of another length than the ``num_hidden_layers`` the overrides give: the
    class derives them for the new depth from its own pattern (``sliding_window_pattern``,
    ``max_window_layers``), as for a model of that depth (the class refused the base's)."""
    depth = overrides.get("num_hidden_layers")
    if not isinstance(depth, int):
        return values
    return {
        name: value
        for name, value in values.items()
        if name not in PER_LAYER
        or name in overrides
        or not isinstance(value, list)
        or len(value) == depth
    }


def safe_dict(config_class: type, values: dict[str, Any]) -> dict[str, Any]:
    """``config_class(**values).to_dict()``, or nothing where the class refuses ``values``."""
    try:
        return config_class(**values).to_dict()
    except Exception:
        return {}


def unknown_key_errors(keys: set[str], config: PretrainedConfig, key: str) -> list[str]:
    """A key the config class neither takes nor turns into another: it stays an attribute of its
    own, which a default config of the class does not have."""
    known = set(safe_dict(type(config), {})) | set(type(config).attribute_map)
    errors = []
    for name in sorted(keys):
        if name in known or name not in config.to_dict():
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {key}.{near[0]}?" if near else "remove it"
        errors.append(f"{key}.{name}: a {config.model_type} config has no key {name!r}; {hint}")
    return errors


def head_errors(config: PretrainedConfig, key: str) -> list[str]:
    """Grouped-query attention shares each key/value head among whole groups of query heads."""
    heads = getattr(config, "num_attention_heads", None)
    groups = getattr(config, "num_key_value_heads", None)
    if not isinstance(heads, int) or not isinstance(groups, int) or groups < 1:
        return []
    if heads % groups == 0:
        return []
    return [
        f"{key}: num_attention_heads={heads} is not a multiple of num_key_value_heads={groups}; "
        f"give both (e.g. num_attention_heads={groups * max(1, heads // groups)})"
    ]


SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)
"""A config's sizes: a count below 1 was torch's "negative dimension" traceback as the model
was built (a vocabulary of 0, once loaded, refused with advice that could not be followed)."""


def size_errors(config: PretrainedConfig, key: str, overrides: Mapping[str, Any]) -> list[str]:
    """One message per size of ``config`` (given in ``overrides``) below 1."""
    return [
        f"{key}.{name}={value!r}: must be an integer >= 1"
        for name in SIZES
        if name in overrides
        and (
            isinstance(value := getattr(config, name, None), bool)
            or not isinstance(value, int)
            or value < 1
        )
    ]
