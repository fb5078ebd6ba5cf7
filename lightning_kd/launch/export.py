"""The library half of ``lightning-kd export``: a saved model checked, then written as a GGUF.

Everything that can be known before the weights load is checked first, in one refusal: the
directory (a ``save_pretrained`` one, not a training run that has not saved its student yet), its
architecture and tokenizer, and the output file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lightning_kd.export.gguf import export_saved, exported_here, saved_errors
from lightning_kd.export.gguf_names import gguf_path
from lightning_kd.launch.entry import check_entry
from lightning_kd.launch.paths import out_file_errors
from lightning_kd.launch.unfinished import unfinished_run_error
from lightning_kd.models.sources import is_gguf
from lightning_kd.models.unreadable import saved_model_errors
from lightning_kd.utils.stopping import Interrupted, stopping_at_once


def export_directory(directory: Path, kind: str, out: Path) -> Path:
    """Write the saved model in ``directory`` as a GGUF of ``kind`` at ``out``; returns it."""
    default = gguf_path(directory, kind)  # runs/kd/student: runs/kd/student.f16.gguf

    def ours(path: Path) -> bool:
        """An export's GGUF: marked so, or (written before the mark) where exports go."""
        return exported_here(path) or (path.resolve() == default.resolve() and is_gguf(path))

    out_errors = out_file_errors("--out", out, default.name, ours=ours)
    if out.suffix != ".gguf" and out.name and not out.is_dir():  # a directory: named above
        # transformers' GGUF reader, and evaluate, find it by its suffix
        out_errors.append(
            f"--out {out}: name the file .gguf, e.g. --out {out.with_suffix('.gguf')}"
        )
    check_entry(extra=directory_errors(directory) + out_errors)
    try:
        with stopping_at_once("the export"):
            path = export_saved(directory, kind, out)
    except Interrupted as stop:
        print(f"{stop}: nothing was written ({out} is as it was)", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MB)")
    return path


def directory_errors(directory: Path) -> list[str]:
    """Why ``directory`` is not a saved model to convert (missing, or no ``config.json``; a
    training run that has not saved its student named with the command that finishes it), or
    one a GGUF cannot hold (its architecture or tokenizer)."""
    unfinished = unfinished_run_error(directory, "the directory")
    if unfinished is not None:
        return [unfinished]
    if (directory / "config.json").is_file():
        return saved_model_errors(directory, "the directory", tokenizer=True) or saved_errors(
            directory
        )
    what = (
        "has no config.json"
        if directory.is_dir()
        else "is a file, not a directory"
        if directory.exists()
        else "does not exist"
    )
    return [
        f"{directory} {what}: give a save_pretrained directory, e.g. a run's student/ "
        "(lightning-kd export runs/kd/student --gguf q8_0)"
    ]
