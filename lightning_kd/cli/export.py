"""``lightning-kd export``: a saved student as one GGUF file for llama.cpp, without training.

    lightning-kd export runs/kd/student --gguf q8_0      # writes runs/kd/student.q8_0.gguf
    lightning-kd export runs/kd/student --gguf f16 --out smollm2-6l.f16.gguf

What a run's ``export.gguf=f16|q8_0`` writes, from a ``save_pretrained`` directory (a run's
``student/``). Llama-family models only (SmolLM2's architecture), with a byte-level BPE tokenizer;
another is refused by name before the weights load. The file appears whole or not at all.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from lightning_kd.cli.formatting import HelpFormatter
from lightning_kd.export.gguf_names import GGUF_KINDS, gguf_path
from lightning_kd.utils import starting


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-kd export",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("directory", type=Path, help="a save_pretrained directory (RUN/student)")
    parser.add_argument("--gguf", required=True, choices=GGUF_KINDS, help="the GGUF type")
    parser.add_argument(
        "--out", type=Path, help="the file to write (default: beside DIRECTORY, <name>.<type>.gguf)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> Path:
    """Write the GGUF ``argv`` asks for; returns its path."""
    args = parser().parse_args(argv)
    # A quoted "~/student" reaches here as it is, as evaluate's model paths do (probe 48).
    args.directory = args.directory.expanduser()
    args.out = None if args.out is None else args.out.expanduser()
    # Imported once the arguments parse: `--help` and a mistyped option answer at once, not
    # after torch, transformers and Lightning have loaded (seconds).
    from lightning_kd.launch.export import export_directory

    starting.end()  # imported: a Ctrl+C is a KeyboardInterrupt again (utils/starting.py)
    out = args.out if args.out is not None else gguf_path(args.directory, args.gguf)
    return export_directory(args.directory, args.gguf, out)
