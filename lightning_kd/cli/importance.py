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

from lightning_kd.cli.hydra_help import hydra_help, wants_help


def main(argv: Sequence[str]) -> int:
    """Print the layer table ``lightning-kd train <argv>`` would choose from."""
    if wants_help(argv):  # before torch and Lightning load (cli/hydra_help.py)
        print(hydra_help("importance", __doc__, argv, hydra_run=False))
        return 0
    parser = argparse.ArgumentParser(prog="lightning-kd importance", add_help=False)
    parser.add_argument("--config-dir", "-cd", action="append", default=[], metavar="DIR")
    parser.add_argument("--cfg", choices=["job"])
    args, overrides = parser.parse_known_args(argv)
    if flags := [word for word in overrides if word.startswith("-")]:
        parser.error(f"takes --config-dir, --cfg job and config overrides only, not {flags}")
    if missing := [d for d in args.config_dir if not Path(d).is_dir()]:
        parser.error(f"--config-dir {missing[0]}: no such directory")
    # Imported once the arguments parse: a mistyped flag answers at once, not after torch,
    # transformers and Lightning have loaded (seconds).
    from omegaconf import OmegaConf

    from lightning_kd.cli.hydra_command import composed
    from lightning_kd.launch.importance import run
    from lightning_kd.utils import starting

    cfg = composed(argv)
    starting.end()  # composed: a stop is said as a stop in the scoring (utils/starting.py)
    if args.cfg is not None:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    ranking = run(cfg)
    print(ranking.table())
    layers = f"{len(ranking.kept)} layer" + "s" * (len(ranking.kept) != 1)
    print(
        f"\nkept by {ranking.by} ({layers}, {ranking.tokens} calibration "
        f"tokens from the training split, {ranking.seconds:.0f} s): "
        f"student.layers=[{','.join(map(str, ranking.kept))}]"
    )
    return 0
