"""Settings of a mode the run does not use are said before anything loads (launch/inert_keys)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.inert_keys import inert_notes
from tests.conftest import ROOT

EXPERIMENTS = sorted(path.stem for path in (ROOT / "conf" / "experiment").glob("*.yaml"))


def notes(*overrides: str) -> list[str]:
    return inert_notes(compose_config(list(overrides), output_dir="/tmp/unused"))


def test_a_setting_of_a_mode_that_is_off_is_said_naming_the_mode() -> None:
    """data.val_size=4 validated on the data.val_fraction split, and distill.on_policy_tokens,
    distill.blockwise_lr did nothing, without a word (probe 55)."""
    said = notes("debug=smoke", "data.val_size=4", "distill.on_policy_tokens=16")
    assert said == [
        "data.val_size=4 does nothing in this run: only streamed data reads it "
        "(data.streaming=true); read whole, data.val_fraction holds out the validation split; "
        "drop it, or turn streamed data on",
        "distill.on_policy_tokens=16 does nothing in this run: only on-policy KD reads it "
        "(distill.on_policy > 0); drop it, or turn on-policy KD on",
    ]
    repair = notes("debug=smoke", "distill.blockwise_lr=0.5")
    assert repair[0].startswith("distill.blockwise_lr=0.5 does nothing in this run")
    others = notes("debug=smoke", "cache.keep_repair_states=true", "distill.on_policy_seed=5")
    assert [note.split(" does")[0] for note in others] == [
        "distill.on_policy_seed=5",
        "cache.keep_repair_states=true",
    ]
    assert notes("data.val_size=4", "data.streaming=true") == []  # its mode is on
    assert notes("data=chat", "distill.on_policy=0.5", "distill.on_policy_tokens=16") == []


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_no_shipped_experiment_sets_a_key_its_run_does_not_read(experiment: str) -> None:
    assert notes(f"experiment={experiment}") == []
