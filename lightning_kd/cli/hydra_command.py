"""Hydra commands (train, cache, generate): a task function run over the shipped configs, with
the command line given as a list rather than read from ``sys.argv``."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from lightning_kd.launch.config import CONF_DIR, register_defaults
from lightning_kd.launch.paths import run_dir_errors
from lightning_kd.utils.refusal import REFUSED_EXIT, Refused, refuse
from lightning_kd.utils.stopping import STOP, Interrupted


def run_hydra(task: Callable[[DictConfig], Any], argv: Sequence[str]) -> Any:
    """``task(cfg)`` for the config Hydra composes from ``argv`` (overrides, ``--config-dir``,
    ``-m``, ``--help``, ...), over the shipped configs.

    Hydra reads ``sys.argv``, so it holds ``argv`` while Hydra parses it; the task then sees the
    command as the user typed it again, because Lightning's DDP launcher starts each further rank
    by re-running ``sys.argv`` (``lightning-kd train ...``, ``python run.py ...``). Refused input
    exits 2 with its message alone, as every command does (Hydra would print a traceback and
    exit 1 for any exception).
    """
    typed = list(sys.argv)

    @functools.wraps(task)  # Hydra names the job after the task's module (train, cache, ...)
    def as_typed(cfg: DictConfig) -> Any:
        sys.argv = typed
        try:
            return stoppable(task)(cfg)
        except Refused as refused:
            print(f"lightning-kd: {refused}", file=sys.stderr)
            raise SystemExit(REFUSED_EXIT) from None

    try:
        check_run_dir(argv)
    except Refused as refused:
        print(f"lightning-kd: {refused}", file=sys.stderr)
        raise SystemExit(REFUSED_EXIT) from None
    register_defaults()
    sys.argv = [typed[0] if typed else "lightning-kd", *argv]
    main = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    try:
        return main(as_typed)()
    finally:
        sys.argv = typed


def check_run_dir(argv: Sequence[str]) -> None:
    """Refuse a ``hydra.run.dir=`` override Hydra would trip on or misread, before Hydra runs:
    it creates the directory before any task does (a file there is a raw ``FileExistsError``,
    ``~/x`` a directory named ``~``). The config check sees the same value again as
    ``output_dir``, for a notebook's composed config."""
    words = [word for word in argv if word.startswith("hydra.run.dir=")]
    if not words:
        return
    try:
        (override,) = OverridesParser.create().parse_overrides(words[-1:])
    except Exception:  # Hydra names a malformed override itself, when it parses
        return
    value = override.value()
    if isinstance(value, str) and "${" not in value:  # an interpolation is Hydra's to resolve
        refuse(run_dir_errors(value))


def stoppable(task: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """``task`` under the process's stop request: SIGINT/SIGTERM stop it at its next clean
    point (a written shard, a generated batch) and exit 130/143 saying what is kept; running the
    same command again continues. (``train`` installs it too and says more: how to resume.)"""

    def run(cfg: DictConfig) -> Any:
        with STOP.installed():
            try:
                return task(cfg)
            except Interrupted as stop:
                if not stop.reported:
                    print(f"\n{stop}\nRun the same command again to continue.", flush=True)
                sys.exit(stop.exit_code)
            except KeyboardInterrupt:  # a second Ctrl+C
                sys.exit(128 + signal.SIGINT)

    return run


def typed_command(verb: str) -> list[str]:
    """How the user launched this command, for the hints a run prints (the resume command):
    ``python run.py``, ``python -m lightning_kd train`` or ``lightning-kd train``."""
    script = sys.argv[0] if sys.argv else ""
    if script.endswith("run.py"):
        return ["python", script]
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", "").startswith("lightning_kd"):
        return ["python", "-m", "lightning_kd", verb]
    return ["lightning-kd", verb]
