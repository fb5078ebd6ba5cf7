"""The command lines a stopped run prints: the one that resumes it from its latest checkpoint,
or starts it again, from any directory, with the overrides it was launched with.

Each value this module writes (the run directory, a relative path made absolute) is written as
Hydra's override grammar reads it: quoted where it holds a character its unquoted values may not
(a non-ASCII letter, a comma, a quote), which Hydra's lexer refused in the printed command.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from lightning_kd.training.rundir import run_outputs

PLAIN = re.compile(r"[A-Za-z0-9_./\-+@%:*?|$ ]+")
"""What Hydra reads as one unquoted value (a space inside it included)."""


def hydra_text(text: str) -> str:
    """``text`` as a Hydra override value: as it is where Hydra reads it so, else in double
    quotes (inside which Hydra reads a backslash as itself, but before a quote)."""
    if PLAIN.fullmatch(text) and text == text.strip():
        return text
    return '"' + text.replace('"', '\\"') + '"'


def resume_command(command: Sequence[str], overrides: list[str], run_dir: Path) -> str:
    """The command line that resumes this run from its directory's latest checkpoint
    (``command``: how it was launched, e.g. ``["lightning-kd", "train"]``)."""
    return rerun_command(command, overrides, run_dir, "ckpt_path=last")


def restart_command(command: Sequence[str], overrides: list[str], run_dir: Path) -> str:
    """The command line that starts this run again in its directory, which holds no checkpoint:
    with ``overwrite=true`` where the directory holds outputs a new run would be refused for
    (the shared teacher cache, outside it, is reused)."""
    return rerun_command(command, overrides, run_dir, *restart_extra(run_dir))


def restart_extra(run_dir: Path) -> list[str]:
    """``overwrite=true`` where ``run_dir`` holds outputs a new run would be refused for."""
    return ["overwrite=true"] if run_outputs(run_dir) else []


def rerun_command(command: Sequence[str], overrides: list[str], run_dir: Path, *extra: str) -> str:
    """``command`` with this run's ``overrides`` (less its checkpoint, overwrite and directory
    settings), its directory and ``extra``, quoted for a shell."""
    dropped = ("ckpt_path=", "overwrite=", "hydra.run.dir=", "+ckpt_path=", "++ckpt_path=")
    kept = [anchored(item) for item in overrides if not item.startswith(dropped)]
    words = [*command, *kept, f"hydra.run.dir={hydra_text(str(run_dir))}", *extra]
    return " ".join(shlex.quote(word) for word in words)


PATH_KEYS = ("files", "val_files", "path", "teacher_answers", "teacher_cache", "dir", "prompts")
"""The last part of a setting that names local files or directories (``data.files``,
``teacher.path``, ``distill.teacher_cache``, ``generate.prompts``, ``cache.dir``, ...)."""


def anchored(override: str) -> str:
    """``override`` with each relative path it names that exists here made absolute, so that
    the printed command works from any directory (a new shell, a requeued job), as its run
    directory does; names that are no local path (``smollm2``, ``auto``) are kept."""
    key, equals, value = override.partition("=")
    if not equals or key.rsplit(".", 1)[-1] not in PATH_KEYS or "${" in value:
        return override
    listed = value.startswith("[") and value.endswith("]")
    items = [item.strip() for item in value[1:-1].split(",")] if listed else [value]
    absolute = [absolute_item(item) for item in items]
    return f"{key}={'[' + ','.join(absolute) + ']' if listed else absolute[0]}"


def absolute_item(item: str) -> str:
    """``item`` (a value as given, maybe in Hydra's quotes) made absolute where it names a
    relative path that exists here; as given otherwise."""
    bare = item
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        bare = item[1:-1].replace("\\" + item[0], item[0])
    return hydra_text(os.path.abspath(bare)) if is_local(bare) else item


def is_local(item: str) -> bool:
    """Whether ``item`` is a relative path (or glob) to something that exists here."""
    return bool(item) and not Path(item).is_absolute() and bool(glob.glob(item))
