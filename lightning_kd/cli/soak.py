"""``lightning-kd soak [--steps N] [--warmup N] [--out DIR]``: many optimizer steps of the real
launch (the smoke config with feature matching and accumulation), watching for resident memory
that only grows and for captures that hold records after a step. Exits 1 if RSS grew by 1 % or
more from the warm-up to the end, or a capture held anything."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from lightning_kd.bench.soak import MAX_GROWTH, out_errors, soak
from lightning_kd.cli.formatting import HelpFormatter
from lightning_kd.launch.entry import check_entry
from lightning_kd.utils import starting


def main(argv: Sequence[str] | None = None) -> int:
    starting.end()  # imported: a Ctrl+C is a KeyboardInterrupt again (utils/starting.py)
    parser = argparse.ArgumentParser(
        prog="lightning-kd soak", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps of the launch")
    parser.add_argument(
        "--warmup", type=int, default=100, help="steps before the memory baseline is taken"
    )
    parser.add_argument("--out", type=Path, default=Path("soak"), help="the report's directory")
    args = parser.parse_args(argv)
    check(args)
    try:
        report, ok = soak(args.steps, args.warmup, args.out)
    except RuntimeError as error:
        print(error, file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    growth = report["rss_growth"]
    grew = "not measured after the baseline" if growth is None else f"{growth:+.2%}"
    print(
        f"{'PASS' if ok else 'FAIL'}: RSS {grew} from step {args.warmup} to {report['steps']} "
        f"(limit {MAX_GROWTH:.0%}), {report['captures_retained']} captures retained"
    )
    return 0 if ok else 1


def check(args: argparse.Namespace) -> None:
    """The step counts and ``--out``, before the soak's run starts: a baseline taken at the last
    step (or after it) would compare the end with itself and pass whatever the memory did, and
    the soak's run starts afresh in ``--out`` (``overwrite=true``). A baseline at step 0, before
    any step, counted the first step's one-off buffers as growth: every such soak failed."""
    numbers = {"--steps": args.steps, "--warmup": args.warmup}
    late = args.warmup >= args.steps >= 2
    extra = [
        f"--warmup={args.warmup} with --steps={args.steps}: the baseline is taken at step "
        f"--warmup, so it must come before the last step; e.g. --warmup={max(args.steps // 10, 1)}"
    ]
    extra = (extra if late else []) + out_errors(args.out)
    check_entry(command="soak", options=numbers, extra=extra)
