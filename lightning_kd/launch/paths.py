"""Where a command writes, checked before anything loads: each message names the path and a fix.

A run directory that is a file fails in Hydra's own ``mkdir`` with a raw traceback, and one
written ``~/x`` becomes a directory literally named ``~`` (Hydra does not expand it); a command's
output file found to be a directory only once its work is done loses that work; and ``cache`` or
``generate`` pointed at a training run's directory would write their own record (``.hydra/``)
over that run's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_kd.cache.format import INDEX_NAME, SHARD_DIR
from lightning_kd.generation.teacher_completions import OUTPUT_NAME
from lightning_kd.models.cache_places import SHARED_ENV, cache_root
from lightning_kd.training.rundir import OUTPUTS, run_outputs
from lightning_kd.utils.files import blocking_file


def run_dir_errors(run_dir: str | Path, key: str = "hydra.run.dir") -> list[str]:
    """Why ``run_dir`` cannot be a run directory (a file, a file above it, a ``~`` in it)."""
    path = Path(run_dir)
    if any(part.startswith("~") for part in path.parts):
        return [
            f"{key}={run_dir}: Hydra does not expand '~', so this would make a directory named "
            f"'~'; give $HOME/... or an absolute path, e.g. {key}={Path.home()}/{path.name}"
        ]
    if long := [part for part in path.parts if len(part.encode()) > NAME_MAX]:
        return [  # os.stat's ENAMETOOLONG was a raw traceback (probe 48)
            f"{key}: its name {long[0][:24]}... is {len(long[0].encode())} bytes long, past the "
            f"{NAME_MAX} a file system takes for one name; give a shorter one"
        ]
    return out_dir_errors(key, path, sep="=")


NAME_MAX = 255
"""The longest name (in bytes) of one file or directory on the common file systems."""


RUN_SUBDIRECTORIES = ("checkpoints", "logs", "student")
"""The directories a training run writes into its run directory."""


def run_subdirectory_errors(run_dir: str | Path, key: str = "hydra.run.dir") -> list[str]:
    """Why a directory a run writes into, already in ``run_dir`` (a run resumed, or run again),
    cannot take its files: a file by its name, or one not writable (another owner, a read-only
    mount), and a directory where it writes a file. Found at the first checkpoint, the steps
    since the last one were lost."""
    errors = []
    for name in RUN_SUBDIRECTORIES:
        path = Path(run_dir) / name
        if path.exists() and not path.is_dir():
            errors.append(
                f"{key}={run_dir}: {path} is a file where the run writes its {name}/ directory; "
                "move it away"
            )
        elif path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            errors.append(
                f"{key}={run_dir}: {path} is not writable (read-only, or no permission), and the "
                f"run writes its {name} there; make it writable, or give another {key}"
            )
    for name in ("student", "student-best"):  # replaced whole: the link, not its target
        if (link := Path(run_dir) / name).is_symlink():
            errors.append(
                f"{key}={run_dir}: {link} is a link (to {os.readlink(link)}); the run replaces its "
                f"{name}/ whole, so the link would become a directory and its target keep the "
                "old student. Remove the link, and copy the student there after the run"
            )
    for name in RUN_FILES:  # it trained and exported, then failed on an IsADirectoryError
        if (Path(run_dir) / name).is_dir():
            errors.append(
                f"{key}={run_dir}: {Path(run_dir) / name} is a directory where the run writes "
                "its file of that name; move it away"
            )
    return errors


RUN_FILES = ("summary.json", "summary.md")
"""The files a training run writes into its run directory (probe 59)."""


def out_dir_errors(option: str, out: Path, sep: str = " ") -> list[str]:
    """Why ``out`` cannot be the output directory ``option`` names (a file, or under one)."""
    blocking = blocking_file(Path(out))
    if blocking is None:
        return unwritable_errors(f"{option}{sep}{out}", Path(out))
    if blocking.is_symlink() and not blocking.exists():  # said "is a file" (probe 48)
        return [
            f"{option}{sep}{out}: {blocking} is a link to {os.readlink(blocking)}, which does "
            "not exist (a disk not mounted?); mount or create it, or give another directory"
        ]
    where = "is a file" if blocking == Path(out) else f"is under the file {blocking}"
    # The example sits beside the file, with the rest of the path kept: not under the file.
    example = blocking.with_name(blocking.name + "-out") / Path(out).relative_to(blocking)
    return [f"{option}{sep}{out} {where}; give a directory, e.g. {option}{sep}{example}"]


def out_file_errors(
    option: str,
    out: Path | None,
    example: str = "out.json",
    ours: Callable[[Path], bool] | None = None,
) -> list[str]:
    """Why ``out`` cannot be the output file ``option`` names: a directory, under a file, or an
    existing file that ``ours`` does not recognise as one the command wrote (a model's weights,
    the data it reads: replaced whole, they were lost). A missing parent directory is fine: the
    command creates it when it writes. ``example``: a file name of the kind the command writes,
    for the fix."""
    if out is None:
        return []
    out = Path(out)
    if out.is_dir():
        return [f"{option} {out} is a directory; give a file path, e.g. {option} {out / example}"]
    if out.is_file() and ours is not None and not ours(out):
        other = out.parent / example
        if other == out:  # the advice is another path
            other = out.with_name(f"{out.stem}.new{out.suffix}")
        return [
            f"{option} {out} exists and is not a file this command writes ({example}); it would "
            f"be replaced: move it away, or give another path, e.g. {option} {other}"
        ]
    blocking = blocking_file(out.parent)
    if blocking is None:
        return unwritable_errors(f"{option} {out}", out.parent)
    return [f"{option} {out} is under the file {blocking}; give a path in a directory"]


def unwritable_errors(named: str, directory: Path) -> list[str]:
    """Why nothing can be written in ``directory`` (or, where it does not exist yet, in the
    nearest directory above it that does): a read-only file system or a directory without
    write permission, found now rather than after the work whose result it would hold."""
    existing = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if existing is None or writable(existing):
        return []
    return [
        f"{named}: {existing} is not writable (read-only, or no permission); give a path "
        "you can write to"
    ]


def writable(directory: Path) -> bool:
    """Whether a directory can be made in ``directory``, tried: ``os.access`` says yes to root
    everywhere, where /sys refuses (EPERM) and /proc has no such entry (ENOENT)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lightning-kd-", dir=directory))
    except OSError:
        return False
    return True


def sets_run_dir(word: str) -> bool:
    """Whether the command-line word ``word`` sets ``hydra.run.dir`` (``+``/``++`` too)."""
    return word.lstrip("+").startswith("hydra.run.dir=")


def default_run_dir_errors(argv: Sequence[str], own_configs: bool = False) -> list[str]:
    """A command without ``hydra.run.dir`` writes under ``./outputs``, which Hydra creates
    before any task runs: in a directory that cannot take it, a traceback (exit 1). Configs of
    the user's (``own_configs``: ``--config-dir``) may name one, unknown until Hydra composes
    them: left to Hydra there."""
    makes_none = {"-m", "--multirun", "--cfg", "-c", "--info", "--hydra-help"}  # or a sweep's
    if own_configs or any(word in makes_none or sets_run_dir(word) for word in argv):
        return []
    here = Path.cwd()
    if writable(here / "outputs" if (here / "outputs").is_dir() else here):
        return []
    return [
        f"the run directory, outputs/<date>/<time> in the current directory {here}, cannot be "
        "made there (read-only, or no permission); run from a directory you can write to, or "
        "give one with hydra.run.dir=DIR"
    ]


def cache_root_errors() -> list[str]:
    """Why the package's cache (data files' digests, tokenized datasets, converted GGUF
    weights, teacher caches) cannot be written where ``$LIGHTNING_KD_CACHE`` says: a read-only
    ``$HOME`` on compute nodes failed in the first digest's write, with a traceback."""
    root = cache_root()
    set_here = bool(os.environ.get("LIGHTNING_KD_CACHE"))  # else the default: not the user's
    named = f"$LIGHTNING_KD_CACHE ({root})" if set_here else f"the package's cache {root}"
    if blocking := blocking_file(root):
        return [f"{named} is under the file {blocking}; set LIGHTNING_KD_CACHE to a directory"]
    if not unwritable_errors(named, root):
        return []
    return [
        f"{named} cannot be written (read-only, or no permission); set LIGHTNING_KD_CACHE to a "
        "directory you can write, e.g. LIGHTNING_KD_CACHE=/scratch/$USER/lightning_kd; a cache "
        f"shared read-only is read from beside it: {SHARED_ENV}={root} "
        "(docs/cache.md#housekeeping)"
    ]


def cache_dir_errors(directory: object) -> list[str]:
    """Why ``cache.dir`` (the teacher caches ``auto`` writes) cannot hold a cache: a file, under
    a file, or not writable. Found as ``auto`` made its directory, a traceback once the data
    was tokenized and the teacher loaded (probe 37)."""
    if not isinstance(directory, str | Path) or not str(directory):
        return []  # null: the package's cache; another type is the rules' to name
    path = Path(directory).expanduser()
    if blocking := blocking_file(path):
        where = "is a file" if blocking == path else f"is under the file {blocking}"
        return [f"cache.dir={directory} {where}; give a directory (or null: the package's cache)"]
    return unwritable_errors(f"cache.dir={directory}", path)


def training_run_errors(directory: Path, command: str) -> list[str]:
    """A message when ``directory`` holds a training run's outputs (``lightning-kd train``'s
    checkpoints, logs, student, summary): ``command`` writing its own record there would replace
    that run's."""
    found = run_outputs(Path(directory))
    if not found:
        return []
    return [
        f"hydra.run.dir={directory} holds a training run's outputs ({', '.join(found)}); "
        f"lightning-kd {command} would write its record (.hydra/) over that run's: give it a "
        f"directory of its own, e.g. hydra.run.dir={directory}-{command}"
    ]


def foreign_directory_errors(directory: Path) -> list[str]:
    """Why ``lightning-kd train`` may not write into ``directory``: it is a directory of another
    training run's outputs (its ``student/``: that run's next export or ``overwrite=true``
    replaced it whole, this run's checkpoints with it, without a word; probe 59), or it holds a
    teacher cache or a generation, whose record (``.hydra/``) this run's would replace (the
    reverse, ``cache`` or ``generate`` into a training run's directory, was refused already)."""
    directory = Path(directory)
    for inner in (directory, *directory.parents):  # its student/, or a folder inside that
        parent = inner.parent
        if inner.name in OUTPUTS and run_outputs(parent) and (parent / ".hydra").is_dir():
            return [
                f"hydra.run.dir={directory} is inside the {inner.name}/ of the training run in "
                f"{parent}, which replaces it whole when it exports or is overwritten: give this "
                f"run a directory of its own, e.g. hydra.run.dir={parent}-2"
            ]
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return [
            f"hydra.run.dir={directory} holds a saved model (config.json and its weights): give "
            f"the run a directory of its own, e.g. hydra.run.dir={directory}-run"
        ]
    holds = {
        "cache": (directory / INDEX_NAME).is_file() or (directory / SHARD_DIR).is_dir(),
        "generate": (directory / OUTPUT_NAME).is_file(),
    }
    return [
        f"hydra.run.dir={directory} holds the output of lightning-kd {command}; lightning-kd "
        "train would write its record (.hydra/) over that one's: give it a directory of its "
        f"own, e.g. hydra.run.dir={directory}-train"
        for command, found in holds.items()
        if found
    ]
