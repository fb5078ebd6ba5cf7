"""How ``cache`` and ``generate`` end when stopped: at their next clean point (a written shard, a
generated batch), exit 130/143, saying what is kept and the command that continues.
(``train`` says more, in its own stop report: how to resume.)"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig

from lightning_kd.training.rundir import is_rank_zero
from lightning_kd.utils.stopping import STOP, Interrupted

SECOND_CTRL_C = "SIGINT again: stopped at once; what was written whole (rows, shards) is kept."


def again(cfg: DictConfig | None) -> str:
    """The line that says how to go on: the same command, without ``overwrite=true`` where it
    was given. With it, the same command removed what the stop kept and began again: a job a
    scheduler requeues after each preemption never finished (probe 59)."""
    if cfg is not None and cfg.get("overwrite") is True:
        return (
            "Run the same command again without overwrite=true to continue (with it, what is "
            "kept would be removed and begun again)."
        )
    return "Run the same command again to continue."


def stoppable(task: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """``task`` under the process's stop request: SIGINT/SIGTERM stop it at its next clean
    point and exit 130/143 saying what is kept and :func:`again`."""

    def run(cfg: DictConfig) -> Any:
        with STOP.installed():
            try:
                return task(cfg)
            except Interrupted as stop:
                if not stop.reported and is_rank_zero():  # each rank stops: one tells it
                    print(f"\n{stop}\n{again(cfg)}", flush=True)
                sys.exit(stop.exit_code)
            except KeyboardInterrupt:  # a second Ctrl+C
                if is_rank_zero():
                    print(f"\n{SECOND_CTRL_C} {again(cfg)}", flush=True)
                sys.exit(128 + signal.SIGINT)

    return run
