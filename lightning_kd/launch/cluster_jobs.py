"""A cluster job (``-m hydra/launcher=submitit_slurm``) resumed where it ran, and its end told.

A job's run is resumed by the ``-m`` command again: the same command without ``-m`` would run
on the machine it is typed on (a login node), or be refused there for its nodes. So a job
prints that command, its launcher and its fields kept, with its own directory named:
``hydra.sweep.dir`` and ``hydra.sweep.subdir`` (its job number) — a launch of that one job.
That needs a sweep directory named at the launch (Hydra's default, ``multirun/<date>/<time>``,
is another each launch: the resume found no checkpoint), so a cluster launch without one is
refused. A job that refused its run (exit 2) is told by its refusal; one that ended without
a result (stopped, or killed) or failed, in a line naming its log, where its own report and
resume command are: Hydra is asked to pass the launcher's error on
(:func:`launcher_errors_passed`) rather than print it as a traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lightning_kd.launch.cluster import PLUGIN

LAUNCH_ONLY = ("hydra.mode=", "hydra.sweep.dir=", "hydra.sweep.subdir=", "hydra.run.dir=")
"""Hydra overrides a job's command sets itself, or that a ``-m`` launch does not take."""
RERUN_DROPPED = ("ckpt_path=", "overwrite=", "+ckpt_path=", "++ckpt_path=")


def sweep_dir_errors(cfg: DictConfig) -> list[str]:
    """A cluster launch without ``hydra.sweep.dir`` (see the module doc): Hydra's default, a
    path of the launch's time, unless a config or the command line names one."""
    named = OmegaConf.to_container(cfg.hydra.sweep, resolve=False).get("dir")
    if "${now:" not in str(named):
        return []
    return [
        "a cluster launch without hydra.sweep.dir: its jobs would write under Hydra's default "
        "multirun/<date>/<time>/, another each launch, so the same command with ckpt_path=last "
        "could not find them to resume; name a directory every node sees, e.g. "
        "hydra.sweep.dir=/shared/runs/my-sweep"
    ]


def job_rerun(
    command: Sequence[str], overrides: Sequence[str], output_dir: Path, *extra: str
) -> str | None:
    """The ``-m`` command that launches this cluster job again into ``output_dir`` with its
    ``overrides`` and ``extra`` (``ckpt_path=last``); None outside a submitit launcher's job."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN:
        return None
    if not str(hydra.launcher.get("_target_", "")).startswith(PLUGIN):
        return None
    kept = [word for word in hydra.overrides.hydra if not word.lstrip("+").startswith(LAUNCH_ONLY)]
    task = [word for word in overrides if not word.startswith(RERUN_DROPPED)]
    subdir, text = str(hydra.sweep.subdir), str(output_dir)
    sweep_dir = text[: -len(subdir) - 1] if text.endswith(f"/{subdir}") else None
    if sweep_dir is None:  # a subdir that is not the path's end: the directory's parent
        sweep_dir, subdir = str(output_dir.parent), output_dir.name
    place = [f"hydra.sweep.dir={sweep_dir}", f"hydra.sweep.subdir={subdir}"]
    words = [*command, "-m", *kept, *task, *place, *extra]
    return " ".join(shlex.quote(word) for word in words)


JOB_ERRORS = ("UncompletedJobError", "FailedJobError")
"""submitit's errors for a job that ended without a result, or with an exception."""


@contextmanager
def launcher_errors_passed(argv: Sequence[str]) -> Iterator[None]:
    """Within the block, Hydra passes a submitit launch's errors on (``HYDRA_FULL_ERROR``)
    rather than print them as a traceback and exit, so that the launching command can tell a
    job's end in a line; the variable is left as it was after."""
    multirun = "-m" in argv or "--multirun" in argv
    if not (multirun and any(word.startswith("hydra/launcher=submitit") for word in argv)):
        yield
        return
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


@contextmanager
def job_ends_told(argv: Sequence[str]) -> Iterator[None]:
    """The block (a launch of ``argv``) with a job that did not finish told in a line naming
    its log, exit 1, rather than as submitit's traceback."""
    with launcher_errors_passed(argv):
        try:
            yield
        except Exception as error:
            if type(error).__name__ not in JOB_ERRORS:
                raise
            if (prefix := log_prefix(str(error))) is not None:
                drop_placeholder(Path(prefix).parent.parent)
            print(f"lightning-kd: {job_end_message(error)}", file=sys.stderr)
            raise SystemExit(1) from None


def log_prefix(text: str) -> str | None:
    """``<folder>/<job id>/<job id>_<task>`` of the job submitit's error ``text`` names: its
    logs are that with ``_log.out`` (stdout) and ``_log.err`` (stderr)."""
    found = re.search(r"with path (\S+)_result\.pkl", text) or re.search(
        r"- (\S+)_log\.(?:out|err)", text
    )
    return found.group(1) if found else None


REFUSAL_LINE = re.compile(r"^(\[[^\]]*rank: \d+\] )?lightning-kd: ")
"""A refusal's first line, a further process's (``[rank: 1] lightning-kd: ...``) included."""


def job_refusal(stderr_log: Path) -> str | None:
    """The refusal a job printed to its stderr log (``lightning-kd: ...`` and the lines indented
    under it), if it ended by refusing its run (exit 2: submitit sees no result, as for a job
    that was killed)."""
    try:
        lines = stderr_log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if REFUSAL_LINE.match(line)]
    if not starts:
        return None
    block = [REFUSAL_LINE.sub("", lines[starts[-1]], count=1)]
    block += [line for line in lines[starts[-1] + 1 :] if line.startswith("  ")]
    return "\n".join(block)


def job_end_message(error: BaseException) -> str:
    """What the launching process says of a job that ended without finishing (``error``:
    submitit's ``UncompletedJobError`` or ``FailedJobError``): its refusal, where it refused its
    run, else how it ended and which log tells more."""
    text = str(error)
    prefix = log_prefix(text)
    out, err = (f"{prefix}_log.out", f"{prefix}_log.err") if prefix else (None, None)
    if err is not None and (refusal := job_refusal(Path(err))) is not None:
        return f"a job refused its run: {refusal}\n(its log: {err})"
    where = "in the job's folder under hydra.sweep.dir/.submitit/"
    if type(error).__name__ == "UncompletedJobError":
        state = re.search(r"\(state: ([^)]*)\)", text)
        return (
            f"a job ended without a result (state {state.group(1) if state else 'unknown'}): it "
            "was stopped (SIGTERM at its time limit, scancel) or killed. Its printout is "
            f"{out or where}; a stopped run's ends with the command that resumes it"
        )
    return f"a job failed: its error ends {err or where} (its printout: {out or where})"


def drop_placeholder(folder: Path) -> None:
    """Remove ``folder/%j`` if empty: submitit makes its folder setting's directory as written
    (``hydra.sweep.dir/.submitit/%j``) before it knows a job id, and leaves it there unused."""
    placeholder = folder / "%j"
    if placeholder.is_dir() and not any(placeholder.iterdir()):
        placeholder.rmdir()
