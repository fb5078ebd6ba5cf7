"""Interpolations that resolve to nothing, named with their key before any check reads them."""

from __future__ import annotations

from omegaconf import OmegaConf

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.interpolations import interpolation_errors


def test_each_unresolved_interpolation_is_named_with_its_key_and_the_nearest_keys() -> None:
    """``data.batch_size=${data.nonexist}`` was a traceback from the first check that read it,
    exit 1 (probe 37)."""
    cfg = compose_config(
        ["debug=smoke", "data.batch_size=${data.block_siz}", "seed=${foo:1}"], output_dir="/x"
    )
    errors = interpolation_errors(cfg)
    assert errors == [
        "seed=${foo:1}: no resolver 'foo' is registered (OmegaConf's: oc.env, oc.select, ...; "
        "this package's: kd.*); write the value, or a ${other.key}",
        "data.batch_size=${data.block_siz}: the config has no key 'data.block_siz' to "
        "interpolate; did you mean data.block_size?",
    ]


def test_what_follows_a_bad_interpolation_is_named_through_it_alone() -> None:
    """A key repeating the bad one fails too; it is not said twice. A ``???`` pointed at is
    named; Hydra's ``${hydra:...}`` outside a launch, and a config without interpolations,
    give nothing."""
    cfg = OmegaConf.create(
        {"a": {"b": "${zzz.qqq}", "c": "${a.b}", "d": "???", "e": "${a.d}"}, "out": "${hydra:x}"}
    )
    assert interpolation_errors(cfg) == [
        "a.b=${zzz.qqq}: the config has no key 'zzz.qqq' to interpolate; name a key the config has",
        "a.e=${a.d}: it names a key without a value (???); set that key",
    ]
    assert interpolation_errors(compose_config(["debug=smoke"], output_dir="/x")) == []


def test_a_node_removed_with_a_tilde_is_named_as_what_the_interpolation_lost() -> None:
    """'~distill' was answered about cache.temperature's interpolation, with the nearest keys
    (distill.feature_weight or generate.temperature) as the fix (probe 52)."""
    argv = ["debug=smoke", "~distill"]
    cfg = compose_config(argv, output_dir="/x")
    (error,) = [e for e in interpolation_errors(cfg, argv) if e.startswith("cache.temperature")]
    assert error.endswith(
        "the config has no key 'distill.temperature' to interpolate; ~distill removed it, and "
        "cache.temperature reads it: give the setting another value (e.g. "
        "distill.temperature=<value>) rather than removing its node"
    )
