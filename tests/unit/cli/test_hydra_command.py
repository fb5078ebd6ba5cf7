"""``cli/hydra_command.py``: how the Hydra commands end when stopped."""

from __future__ import annotations

import signal

import pytest

from lightning_kd.cli.hydra_command import SECOND_CTRL_C, stoppable


def test_a_second_ctrl_c_says_what_is_kept_and_how_to_go_on(capsys) -> None:
    """generate and cache stopped at once on a second Ctrl+C printed nothing after the first
    one's notice (train prints its stop report)."""

    def interrupted(cfg) -> None:
        raise KeyboardInterrupt  # what the stop request raises on a second Ctrl+C

    with pytest.raises(SystemExit) as exit_:
        stoppable(interrupted)(None)
    assert exit_.value.code == 128 + signal.SIGINT
    assert SECOND_CTRL_C in capsys.readouterr().out
    assert "Run the same command again to continue" in SECOND_CTRL_C
