"""Hydra commands (train, cache, generate): a task function run over the shipped configs, with
the command line given as a list rather than read from ``sys.argv``."""

from __future__ import annotations

import functools
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lightning_kd.cli.hydra_help import config_dirs
from lightning_kd.cli.override_grammar import grammar_errors
from lightning_kd.cli.refused_run_dir import drop_empty_run_dir, run_logged, started_outputs
from lightning_kd.cli.stoppable import stoppable
from lightning_kd.cli.sweep_values import sweep_value_errors
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.cluster import launcher_errors, launcher_override_errors, submitit_kind
from lightning_kd.launch.cluster_jobs import drop_placeholder, job_ends_told, sweep_dir_errors
from lightning_kd.launch.config import CONF_DIR, compose_config, register_defaults, stored_nodes
from lightning_kd.launch.domain_names import string_domain_names
from lightning_kd.launch.group_overrides import group_option_errors
from lightning_kd.launch.harness_run import ScoringFailed
from lightning_kd.launch.interpolations import interpolation_errors
from lightning_kd.launch.keys import override_key_errors
from lightning_kd.launch.paths import default_run_dir_errors, run_dir_errors, sets_run_dir
from lightning_kd.launch.sweeps import (
    JobErrors,
    config_job_errors,
    in_process_ddp_errors,
    sweep_job_errors,
)
from lightning_kd.models.unreadable import UnreadableModel
from lightning_kd.training.finite import NonFiniteError
from lightning_kd.training.joining import JoinError
from lightning_kd.training.peers import PeerLost
from lightning_kd.training.rundir import rank_prefix
from lightning_kd.utils.disk import full_disk_message
from lightning_kd.utils.refusal import REFUSED_EXIT, Refused, refuse

JOB_ERRORS: list[JobErrors] = [config_job_errors]
"""How the running command checks each job of a ``-m`` sweep before the first runs
(:func:`run_hydra` sets it): Hydra builds :class:`LaunchCheck` from the config, with no way to
hand it the command's own checks."""


def run_hydra(
    task: Callable[[DictConfig], Any], argv: Sequence[str], jobs: JobErrors = config_job_errors
) -> Any:
    """``task(cfg)`` for the config Hydra composes from ``argv`` (overrides, ``--config-dir``,
    ``-m``, ``--help``, ...), over the shipped configs; ``jobs`` checks each job of a
    sweep before the first runs (:class:`LaunchCheck`).

    Hydra reads ``sys.argv``, so it holds ``argv`` while Hydra parses it; the task then sees the
    command as the user typed it again, because Lightning's DDP launcher starts each further rank
    by re-running ``sys.argv`` (``lightning-kd train ...``, ``python run.py ...``). Refused input
    exits 2 with its message alone, as every command does (Hydra would print a traceback and
    exit 1 for any exception).
    """
    typed = list(sys.argv)
    started = time.time()

    @functools.wraps(task)  # Hydra names the job after the task's module (train, cache, ...)
    def as_typed(cfg: DictConfig) -> Any:
        sys.argv = typed
        try:
            string_domain_names(cfg)  # a domain named 2023: a key no dotted path reaches
            refuse(interpolation_errors(cfg, typed))  # before any check reads a failing value
            return stoppable(task)(cfg)
        except (Refused, UnreadableModel) as refused:  # a damaged model: its file and fix
            drop_empty_run_dir(started)
            exit_refused(refused, started_outputs(started), own_line=run_logged())
        except (NonFiniteError, JoinError, PeerLost, ScoringFailed) as failed:  # said whole
            if not getattr(failed, "reported", False):  # a lost process: the stop report said it
                start = "\n" if isinstance(failed, PeerLost) else ""  # after a progress bar
                print(f"{start}{rank_prefix()}lightning-kd: {failed}", file=sys.stderr)
            raise SystemExit(1) from None
        except OSError as error:  # a full disk is said whole by its message (utils/disk.py)
            exit_write_error(error)

    register_defaults()
    JOB_ERRORS[:] = [jobs]
    try:
        refuse(command_line_errors(argv))
    except Refused as refused:
        exit_refused(refused)
    if "--hydra-help" in argv:  # composed without the config: any override failed (probe 52)
        argv = [word for word in argv if not is_override(word)]
    sys.argv = [typed[0] if typed else "lightning-kd", *argv]
    main = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    try:
        with job_ends_told(argv):  # a cluster job that did not finish: its log tells it whole
            return main(as_typed)()
    finally:
        sys.argv = typed


def exit_write_error(error: OSError) -> NoReturn:
    """Exit 1 saying a full disk (or a refused write) by its message alone, where the stop
    report has not said it already, with its step; any other ``OSError`` goes on as it is."""
    if (message := full_disk_message(error)) is None:
        raise error
    if not getattr(error, "reported", False):
        print(f"{rank_prefix()}lightning-kd: {message}", file=sys.stderr)
    raise SystemExit(1) from None


def command_line_errors(argv: Sequence[str]) -> list[str]:
    """What the command line ``argv`` gets wrong before Hydra composes anything."""
    return (
        flag_order_errors(argv)
        + sweep_value_errors(argv, [word for word in argv if is_override(word)])
        + run_dir_override_errors(argv)
        + default_run_dir_errors(argv, own_configs=bool(config_dirs(argv)))
        + launcher_override_errors(argv)
        + override_errors(argv)
    )


def override_errors(argv: Sequence[str]) -> list[str]:
    """The overrides of ``argv`` that compose no config: one Hydra's grammar cannot read, a
    group set to null, a mistyped key, a group option that does not exist (Hydra's own
    refusals were tracebacks). ``hydra.run.dir`` is :func:`run_dir_override_errors`' to read."""
    words = [word for word in argv if is_override(word) and not sets_run_dir(word)]
    return (
        grammar_errors(words)
        + null_group_errors(argv)
        + override_key_errors(argv)
        + group_option_errors(argv, [CONF_DIR, *config_dirs(argv)], stored_nodes())
    )


def composed(argv: Sequence[str]) -> DictConfig:
    """The config the overrides and ``--config-dir`` flags of ``argv`` compose outside a Hydra
    run (``lightning-kd importance``, which writes nothing), checked as a Hydra command's are;
    a refusal exits 2 with its message, as theirs do."""
    register_defaults()
    overrides = [word for word in argv if is_override(word)]
    try:
        refuse(override_errors(argv))
        cfg = compose_config(overrides, config_dirs=[str(d) for d in config_dirs(argv)])
        refuse(interpolation_errors(cfg, argv))
        return cfg
    except Refused as refused:
        exit_refused(refused)
    except (ConfigCompositionException, OverrideParseException) as error:
        message = str(error).strip()
        if message.startswith("Ambiguous value"):  # a sweep's values: Hydra's advice is -m
            message = f"{message.splitlines()[0]}: {ONE_CONFIG}"
        exit_refused(Refused(message))


ONE_CONFIG = (
    "this command composes one config; give one value (a list: key=[a,b]; a string with "
    "commas: key='a,b')"
)


def exit_refused(refused: Refused, outputs: str = "", own_line: bool = False) -> NoReturn:
    """Print ``refused``'s message alone and exit 2, as every command does for refused input
    (with ``outputs``, what its run wrote, whose rerun needs ``overwrite=true``); ``own_line``:
    after a progress bar, whose last line it continued. A run's further processes say which
    they are: each meets the refusal and prints it."""
    start = "\n" if own_line or outputs else ""
    print(f"{start}{rank_prefix()}lightning-kd: {refused}{outputs}", file=sys.stderr)
    raise SystemExit(REFUSED_EXIT) from None


class LaunchCheck(Callback):
    """A ``-m`` launch through a cluster launcher (``hydra/launcher=submitit_slurm``), checked in
    the launching process before anything is submitted (``conf/config.yaml`` adds it to
    Hydra's callbacks): the launcher's fields and the config's values, which each job checks
    again once it runs, but only after its time in the queue. A sweep the basic launcher runs
    in this process is checked for jobs of several processes, which it cannot run, and each of
    its jobs' values before the first runs (a bad value in the last job was found once the
    others had trained, and the jobs after it never ran)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        kind = submitit_kind(config)
        try:
            refuse(interpolation_errors(config))
            (job_errors,) = JOB_ERRORS
            if kind is None:  # the basic launcher: the jobs run in this process
                refuse(in_process_ddp_errors(config) or sweep_job_errors(config, job_errors))
                return
            errors = launcher_errors(config) + sweep_dir_errors(config) + config_errors(config)
            refuse(errors + sweep_job_errors(config, job_errors, here=False))
        except Refused as refused:
            exit_refused(refused)
        except Exception:  # Hydra turns a callback's exception into a warning and goes on
            print(
                "lightning-kd: the sweep's check failed before any job ran (a bug: please "
                f"report it with this):\n{traceback.format_exc()}",
                file=sys.stderr,
            )
            raise SystemExit(1) from None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if submitit_kind(config) is not None:
            drop_placeholder(Path(config.hydra.launcher.submitit_folder).parent)


def flag_order_errors(argv: Sequence[str]) -> list[str]:
    """A flag (``--config-dir DIR``, ``-m``) between overrides: Hydra's parser takes the
    overrides as one run of words and refuses those after the flag as "unrecognized arguments",
    naming neither the flag nor the fix."""
    overrides = [i for i, word in enumerate(argv) if is_override(word)]
    flags = [i for i, word in enumerate(argv) if word.startswith("-")]
    for flag in flags:
        if overrides and overrides[0] < flag < overrides[-1]:
            return [
                f"{argv[flag]} comes between overrides ({argv[overrides[0]]} ... "
                f"{argv[overrides[-1]]}): put the flags before the overrides "
                f"({argv[flag]} ... key=value)"
            ]
    return []


def null_group_errors(argv: Sequence[str]) -> list[str]:
    """``strategy=null``: Hydra's own refusal of a group set to null was a traceback ("Config
    group override must be a string or a list")."""
    groups = {path.name for path in CONF_DIR.iterdir() if path.is_dir()}
    return [
        f"{word}: {word.split('=')[0]} is a config group, dropped with ~{word.split('=')[0]} "
        "(null is no option of it)"
        for word in argv
        if word.split("=", 1)[0].lstrip("+") in groups and word.split("=", 1)[1:] == ["null"]
    ]


def is_override(word: str) -> bool:
    """``key=value``, ``+key=value``, ``~key`` (a flag's value has no ``=``)."""
    return not word.startswith("-") and ("=" in word or word.startswith("~"))


def run_dir_override_errors(argv: Sequence[str]) -> list[str]:
    """Why a ``hydra.run.dir=`` override is one Hydra would trip on or misread, found before
    Hydra runs: it creates the directory before any task does (a file there is a raw
    ``FileExistsError``, ``~/x`` a directory named ``~``). The config check sees the same value
    again as ``output_dir``, for a notebook's composed config."""
    words = [word for word in argv if sets_run_dir(word)]
    if not words:
        return []
    try:
        (override,) = OverridesParser.create().parse_overrides(words[-1:])
    except Exception:  # Hydra's lexer error, exit 1, with no fix (probe 33)
        # quoted, it would be refused for what run_dir_errors finds (probe 41): that first
        return run_dir_errors(words[-1].partition("=")[2]) or grammar_errors(words[-1:])
    value = override.value()
    if isinstance(value, str) and "${" not in value:  # an interpolation is Hydra's to resolve
        return run_dir_errors(value)
    return []


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
