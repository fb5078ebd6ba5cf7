"""``lightning-kd export``: a saved student as one GGUF file for llama.cpp, without training.

    lightning-kd export runs/kd/student --gguf q8_0      # writes runs/kd/student.q8_0.gguf
    lightning-kd export runs/kd/student --gguf f16 --out smollm2-6l.f16.gguf

What a run's ``export.gguf=f16|q8_0`` writes, from a ``save_pretrained`` directory (a run's
``student/``). Llama-family models only (SmolLM2's architecture), with a byte-level BPE tokenizer;
another is refused by name before the weights load. The file appears whole or not at all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_kd.export.gguf import GGUF_TYPES, export_saved, gguf_path
from lightning_kd.launch.entry import check_entry
from lightning_kd.launch.paths import out_file_errors
from lightning_kd.launch.unfinished import unfinished_run_error
from lightning_kd.models.files import saved_model_errors
from lightning_kd.models.sources import is_gguf
from lightning_kd.utils.stopping import Interrupted, stopping_at_once


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-kd export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("directory", type=Path, help="a save_pretrained directory (RUN/student)")
    parser.add_argument("--gguf", required=True, choices=list(GGUF_TYPES), help="the GGUF type")
    parser.add_argument(
        "--out", type=Path, help="the file to write (default: beside DIRECTORY, <name>.<type>.gguf)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    """Write the GGUF ``argv`` asks for; returns its path."""
    args = parser().parse_args(argv)
    out = args.out if args.out is not None else gguf_path(args.directory, args.gguf)
    example = gguf_path(args.directory, args.gguf).name  # runs/kd/student: student.f16.gguf
    out_errors = out_file_errors("--out", out, example, ours=is_gguf)
    if out.suffix != ".gguf":  # transformers' GGUF reader, and evaluate, find it by its suffix
        out_errors.append(
            f"--out {out}: name the file .gguf, e.g. --out {out.with_suffix('.gguf')}"
        )
    check_entry(extra=directory_errors(args.directory) + out_errors)
    try:
        with stopping_at_once("the export"):
            path = export_saved(args.directory, args.gguf, out)
    except Interrupted as stop:
        print(f"{stop}: nothing was written ({out} is as it was)", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MB)")
    return path


def directory_errors(directory: Path) -> list[str]:
    """Why ``directory`` is not a saved model to convert (missing, or no ``config.json``; a
    training run that has not saved its student named with the command that finishes it)."""
    unfinished = unfinished_run_error(directory, "the directory")
    if unfinished is not None:
        return [unfinished]
    if (directory / "config.json").is_file():
        return saved_model_errors(directory, "the directory", tokenizer=True)
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
