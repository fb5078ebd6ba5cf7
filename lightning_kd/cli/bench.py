"""``lightning-kd bench --out DIR [--quick]``: memory and speed of a KD step against its floor.

The scenarios and what is measured: ``lightning_kd.bench.runner`` (printed by ``--help``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_kd.bench import runner
from lightning_kd.bench.checks import prepare
from lightning_kd.bench.scenarios import SCENARIOS
from lightning_kd.cli.formatting import HelpFormatter
from lightning_kd.utils import starting

DEFAULTS = {"seq": 256, "warmup": 2, "repeats": 5, "loss_repeats": 3}
"""Row length, untimed and timed steps per scenario, timed repeats of each loss sweep point."""

QUICK = {"seq": 128, "warmup": 1, "repeats": 1, "loss_repeats": 1}
"""``--quick``'s: a check that everything runs, not figures to quote. A value given wins."""


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options (the module docstring of ``bench/runner.py`` is its help)."""
    parser = argparse.ArgumentParser(
        prog="lightning-kd bench",
        description=runner.__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="directory for bench.json, bench.md, bench.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check that everything runs: 128-token rows, warm-up on a short batch, one timed "
        "step, the loss sweep up to 2,048 tokens (minutes on a CPU)",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where the models run (cuda where there is one)",
    )
    parser.add_argument("--teacher", default="smollm2", help="teacher.path of the models")
    parser.add_argument(
        "--precision",
        default="auto",
        help="as trainer.precision: auto (from the hardware), 32-true, bf16-mixed, 16-mixed",
    )
    parser.add_argument("--teacher-dtype", default="auto", help="as teacher.dtype (auto follows)")
    parser.add_argument("--student-layers", type=int, default=6, help="teacher layers copied")
    parser.add_argument("--batch", type=int, default=4, help="rows a step")
    for name, full in DEFAULTS.items():  # unset here: --quick picks its own where not given
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=int,
            help=f"{full}; {QUICK[name]} with --quick",
        )
    parser.add_argument(
        "--bf16", action="store_true", help="short for --precision bf16-mixed (bf16 autocast)"
    )
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="lightning_kd's chunked loss without torch.compile (distill.compile=false)",
    )
    # A child process's own work (lightning_kd.bench.runner starts them), not for users.
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--loss-tokens", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--chunked", action="store_true", help=argparse.SUPPRESS)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; in the parent, checked and its precision resolved (``bench/checks.py``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.bf16:
        args.precision = "bf16-mixed"
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:  # `--quick --seq 512` times 512-token rows
            setattr(args, name, value)
    if args.scenario is None and args.loss_tokens is None:
        if args.out is None:
            parser.error("--out DIR is required")
        prepare(args)  # once, in the parent: its children are handed the checked values
    return args


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Run the benchmark (or, with the hidden ``--scenario``/``--loss-tokens``, one child)."""
    starting.end()  # imported: a Ctrl+C is a KeyboardInterrupt again (utils/starting.py)
    return runner.run(parse(argv))
