"""A training run that has not saved its student, named where ``export`` or ``evaluate`` is given
its directory, its (missing) ``student/`` or one of its checkpoints.

A run writes ``student/`` only when training ends; one stopped by Ctrl+C, a kill or a time limit
holds ``checkpoints/last.ckpt`` instead, which is a Lightning checkpoint, not a model. Rather
than a path missing or not a model directory, those commands then say that the run did not
finish and give the command that finishes it (its own overrides, read from
``.hydra/overrides.yaml``).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from lightning_kd.launch.config import config_options
from lightning_kd.training.checkpoints import LAST_NAME
from lightning_kd.training.rerun import restart_command, resume_command

TRAIN = ("lightning-kd", "train")
STUDENT = "student"


def run_of(path: Path) -> Path | None:
    """The training run directory ``path`` is, or is the ``student/`` or a checkpoint of."""
    path = path.expanduser()
    candidates = [path, path.parent] if path.name == STUDENT or path.is_dir() else []
    if path.suffix == ".ckpt" and path.parent.name == "checkpoints":
        candidates = [path.parent.parent]
    return next((c for c in candidates if (c / ".hydra" / "overrides.yaml").is_file()), None)


def unfinished_run_error(path: Path, key: str) -> str | None:
    """Why ``path`` (given as ``key``) is no saved model yet: a run without its ``student/``,
    or a checkpoint of one; ``None`` where it is neither."""
    run = run_of(path)
    if run is None:
        return None
    student = run / STUDENT
    if path.suffix == ".ckpt":
        what = f"{key} {path} is a training checkpoint, not a model"
        if (student / "config.json").is_file():
            return f"{what}: the run's final student is {student}; give that"
    elif (student / "config.json").is_file():
        return None  # a finished run: the model loader points at its student/
    else:
        what = f"{key} {path}: the run {run} has not saved its student"
    finish, note = finishing_command(run)
    return (
        f"{what} (a run writes {student}/ when training ends; this one was stopped or is "
        f"still running); finish it with `{finish}`{note}, then give {student}"
    )


def finishing_command(run: Path) -> tuple[str, str]:
    """The command that takes ``run`` to its end (a resume from its latest checkpoint, or, with
    none saved, the run again in its directory), and a note where its record cannot be read
    (the command then asks for the run's own overrides: a damaged YAML was a traceback)."""
    run = run.absolute()  # the command works from any directory, as a stop report's does
    try:
        overrides = [str(item) for item in OmegaConf.load(run / ".hydra" / "overrides.yaml")]
        command = [*TRAIN]
        if (run / ".hydra" / "hydra.yaml").is_file():  # --config-dir DIR, as it was launched
            command += config_options(OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra)
    except Exception as err:  # YAML's errors, a mapping where a list was, ...
        how = f"{' '.join(TRAIN)} <the run's own overrides> hydra.run.dir={run} ckpt_path=last"
        return how, f" (its record {run / '.hydra'} cannot be read: {str(err).splitlines()[0]})"
    if (run / "checkpoints" / LAST_NAME).is_file():
        return resume_command(command, overrides, run), ""
    return restart_command(command, overrides, run), ""
