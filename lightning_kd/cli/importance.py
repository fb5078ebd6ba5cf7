"""``lightning-kd importance [overrides]``: score the teacher's layers on calibration blocks of the
training split and print the ``student.layers`` that ``student.layers=importance`` would keep,
without training.

    lightning-kd importance                       # the table for the default run
    lightning-kd importance student.num_layers=8 student.importance=greedy_kl
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str]) -> int:
    """Print the layer table ``lightning-kd train <argv>`` would choose from."""
    parser = argparse.ArgumentParser(
        prog="lightning-kd importance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config-dir",
        "-cd",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory of your own configs, searched first (as lightning-kd train takes it)",
    )
    args, overrides = parser.parse_known_args(argv)
    if flags := [word for word in overrides if word.startswith("-")]:
        parser.error(f"takes --config-dir and config overrides only, not {flags}")
    if missing := [d for d in args.config_dir if not Path(d).is_dir()]:
        parser.error(f"--config-dir {missing[0]}: no such directory")
    # Imported once the arguments parse: `--help` and a mistyped flag answer at once, not after
    # torch, transformers and Lightning have loaded (seconds).
    from lightning_kd.launch.config import compose_config
    from lightning_kd.launch.importance import run

    ranking = run(compose_config(overrides, config_dirs=args.config_dir))
    print(ranking.table())
    print(
        f"\nkept by {ranking.by} ({len(ranking.kept)} layers, {ranking.tokens} calibration "
        f"tokens from the training split, {ranking.seconds:.0f} s): "
        f"student.layers=[{','.join(map(str, ranking.kept))}]"
    )
    return 0
