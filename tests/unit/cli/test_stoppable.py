"""``cli/stoppable.py``: how cache and generate end when stopped."""

from __future__ import annotations

import signal

import pytest
from omegaconf import OmegaConf

from lightning_kd.cli.stoppable import SECOND_CTRL_C, stoppable
from lightning_kd.utils.stopping import Interrupted


def test_a_second_ctrl_c_says_what_is_kept_and_how_to_go_on(capsys) -> None:
    """generate and cache stopped at once on a second Ctrl+C printed nothing after the first
    one's notice (train prints its stop report)."""

    def interrupted(cfg) -> None:
        raise KeyboardInterrupt  # what the stop request raises on a second Ctrl+C

    with pytest.raises(SystemExit) as exit_:
        stoppable(interrupted)(None)
    assert exit_.value.code == 128 + signal.SIGINT
    assert f"{SECOND_CTRL_C} Run the same command again to continue." in capsys.readouterr().out


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_stopped_rank_tells_it_only_on_rank_zero(capsys, monkeypatch, rank) -> None:
    """Every rank of a 2-process cache is stopped by the same Ctrl+C: each printed the stop
    line, with its own step. Rank 0 tells it; every rank exits 130."""

    def interrupted(cfg) -> None:
        raise Interrupted(signal.SIGINT, "between shards")

    monkeypatch.setenv("LOCAL_RANK", rank)
    with pytest.raises(SystemExit) as exit_:
        stoppable(interrupted)(None)
    assert exit_.value.code == 128 + signal.SIGINT
    told = "Run the same command again to continue" in capsys.readouterr().out
    assert told == (rank == "0")


def test_a_stop_under_overwrite_says_to_go_on_without_it(capsys) -> None:
    """ "Run the same command again to continue": the same command, overwrite=true in it,
    removed the kept shards or rows and began again; a requeued job never finished (probe 59)."""

    def interrupted(cfg) -> None:
        raise Interrupted(signal.SIGTERM, "between shards")

    for overwrite in (True, False):
        with pytest.raises(SystemExit):
            stoppable(interrupted)(OmegaConf.create({"overwrite": overwrite}))
        out = capsys.readouterr().out
        assert ("again without overwrite=true to continue" in out) == overwrite
