"""A training run that has not saved its student, named where ``export`` or ``evaluate`` is given
its directory, its (missing) ``student/`` or one of its checkpoints.

A run writes ``student/`` only when training ends; one stopped by Ctrl+C, a kill or a time limit
holds ``checkpoints/last.ckpt`` instead, which is a Lightning checkpoint, not a model. Rather
than a path missing or not a model directory, those commands then say that the run did not
finish and give the command that finishes it (its own overrides, read from
``.hydra/overrides.yaml``). ``generate`` and ``cache`` record themselves the same way: their
directories are named as what they are, not as training runs to finish with ``train``.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from lightning_kd.cache.format import INDEX_NAME, META_NAME, SHARD_DIR
from lightning_kd.generation.teacher_completions import OUTPUT_NAME
from lightning_kd.launch.config import config_options
from lightning_kd.training.checkpoints import LAST_NAME
from lightning_kd.training.rerun import restart_command, resume_command
from lightning_kd.training.set_aside import ASIDE

TRAIN = ("lightning-kd", "train")
STUDENT = "student"
OTHER_OUTPUTS = {
    "generate": f"its {OUTPUT_NAME} holds a teacher's answers (rows for data=chat or --prompts)",
    "cache": f"it holds a teacher cache ({INDEX_NAME}, {META_NAME}, {SHARD_DIR}/), which a run "
    "reads as distill.teacher_cache",
}
"""What the Hydra commands other than ``train`` leave in their run directory: no model."""


def run_of(path: Path) -> Path | None:
    """The run directory ``path`` is, or is the ``student/`` or a checkpoint of: one Hydra
    recorded, a training run's or another command's (:func:`writer_of`)."""
    path = path.expanduser()
    candidates = [path, path.parent] if path.name == STUDENT or path.is_dir() else []
    if path.suffix == ".ckpt" and path.parent.name == "checkpoints":
        candidates = [path.parent.parent]
    return next((c for c in candidates if (c / ".hydra" / "overrides.yaml").is_file()), None)


def unfinished_run_error(path: Path, key: str) -> str | None:
    """Why ``path`` (given as ``key``) is no saved model yet: a run without its ``student/``,
    a checkpoint of one, or the directory of ``generate`` or ``cache``; ``None`` where it is
    none of them."""
    run = run_of(path)
    if run is None:
        return None
    if (command := writer_of(run)) in OTHER_OUTPUTS:  # no student will ever be saved there
        return other_output_error(path, run, key, command)
    student = run / STUDENT
    if path.suffix == ".ckpt":
        what = f"{key} {path} is a training checkpoint, not a model"
        if (student / "config.json").is_file():
            return f"{what}: the run's final student is {student}; give that"
    elif (student / "config.json").is_file():
        return None  # a finished run: the model loader points at its student/
    else:
        what = f"{key} {path}: the run {run} has not saved its student"
    if (run / ASIDE / STUDENT / "config.json").is_file():
        return (  # it advised overwrite=true, which set that run aside again (probe 59)
            f"{what}: an overwrite=true run there stopped before its first checkpoint, and the "
            f"earlier run's student waits in {run / ASIDE / STUDENT}; "
            f"`{' '.join(TRAIN)} hydra.run.dir={run}` (without ckpt_path or overwrite=true) puts "
            f"it back; then give {student}"
        )
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


def writer_of(run: Path) -> str:
    """The command that wrote the run directory ``run``: the job name Hydra recorded in
    ``.hydra/hydra.yaml`` (the command's), else (no record, or a damaged one) what the directory
    holds; ``train`` where neither tells."""
    try:
        name = OmegaConf.select(OmegaConf.load(run / ".hydra" / "hydra.yaml"), "hydra.job.name")
    except Exception:  # missing, or YAML's errors: the files tell
        name = None
    if name in (*TRAIN[1:], *OTHER_OUTPUTS):
        return name
    if (run / OUTPUT_NAME).is_file():
        return "generate"
    if (run / INDEX_NAME).is_file() or (run / META_NAME).is_file():
        return "cache"
    return TRAIN[1]


def other_output_error(path: Path, run: Path, key: str, command: str) -> str:
    """``path`` (given as ``key``) is, or is inside, the output directory ``run`` of
    ``command`` (``generate``, ``cache``): no model, and no training run to finish."""
    what = f"{key} {path}" if path.expanduser() == run else f"{key} {path}: {run}"
    return (
        f"{what} is a `lightning-kd {command}` output directory, not a model: "
        f"{OTHER_OUTPUTS[command]}; give a saved model instead, e.g. a training run's "
        f"{STUDENT}/ directory"
    )
