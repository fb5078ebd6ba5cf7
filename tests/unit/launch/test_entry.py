"""The one validation every command runs before any model loads (``launch/entry.py``)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.entry import Length, check_entry
from lightning_kd.utils.refusal import Refused


def test_config_options_and_lengths_are_refused_at_once() -> None:
    cfg = compose_config(["debug=smoke", "data.batch_size=0"])
    models = {"the student": lambda: 32, "the teacher": lambda: 128}
    with pytest.raises(Refused) as refused:
        check_entry(
            cfg,
            command="evaluate",
            options={"--batch-size": 0, "--temperature": float("nan")},
            lengths=[Length("--block-size", 64, models)],
        )
    message = str(refused.value)
    assert message.startswith("4 values are refused:"), message
    assert "data.batch_size=0: must be an integer >= 1; e.g. data.batch_size=4" in message
    assert "--batch-size=0: must be an integer >= 1; e.g. --batch-size=8" in message
    assert "--temperature=nan: must be a finite number > 0; e.g. --temperature=1.0" in message
    assert "--block-size=64 is longer than the student's 32 positions" in message
    assert "the teacher's" not in message  # 64 fits its 128


def test_a_model_that_cannot_say_its_positions_is_reported_with_the_rest() -> None:
    def missing() -> int:
        raise FileNotFoundError("teacher.path=/no/such does not exist")

    with pytest.raises(Refused) as refused:
        check_entry(
            command="soak",
            options={"--steps": 0},
            lengths=[Length("data.block_size", 64, {"the teacher": missing})],
        )
    assert "--steps=0" in str(refused.value)
    assert "teacher.path=/no/such does not exist" in str(refused.value)


def test_a_bad_length_is_not_compared_with_the_positions() -> None:
    def unread() -> int:
        raise AssertionError("positions read for a length that is itself refused")

    with pytest.raises(Refused, match=r"--seq=0: must be an integer >= 2"):
        check_entry(
            command="bench", options={"--seq": 0}, lengths=[Length("--seq", 0, {"x": unread})]
        )
