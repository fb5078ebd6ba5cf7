"""``lightning-kd bench --out DIR [--quick]``: memory and speed of a KD step against its floor.

The scenarios and what is measured: ``lightning_kd.bench.runner`` (printed by ``--help``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from lightning_kd.bench import runner
from lightning_kd.bench.scenarios import SCENARIOS
from lightning_kd.evaluation.harness import device_errors
from lightning_kd.launch.entry import Length, check_entry
from lightning_kd.launch.paths import out_dir_errors
from lightning_kd.launch.precision_checks import choice_errors, fp16_autocast_errors
from lightning_kd.models.loading import TeacherSpec, check_dtype
from lightning_kd.models.positions import spec_config, teacher_positions
from lightning_kd.models.precision import AUTO, probe_hardware, resolve_precision
from lightning_kd.models.student import check_num_layers
from lightning_kd.utils.refusal import refuse


def build_parser() -> argparse.ArgumentParser:
    """The benchmark's options (the module docstring of ``bench/runner.py`` is its help)."""
    parser = argparse.ArgumentParser(
        prog="lightning-kd bench",
        description=runner.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, help="directory for bench.json, bench.md, bench.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check that everything runs: 128-token rows, warm-up on a short batch, one timed "
        "step, the loss sweep up to 2,048 tokens (minutes on a CPU)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--teacher", default="smollm2", help="teacher.path of the models")
    parser.add_argument(
        "--precision",
        default="auto",
        help="as trainer.precision: auto (from the hardware), 32-true, bf16-mixed, 16-mixed",
    )
    parser.add_argument("--teacher-dtype", default="auto", help="as teacher.dtype (auto follows)")
    parser.add_argument("--student-layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loss-repeats", type=int, default=3)
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
    """The command line; in the parent, the precision resolved as ``lightning-kd train`` does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.bf16:
        args.precision = "bf16-mixed"
    # Resolved once, in the parent, as lightning-kd train resolves it (with its one warning); the
    # children are handed the concrete values and resolve nothing again.
    if args.scenario is None and args.loss_tokens is None:
        refuse(setting_errors(args))  # before the precision is resolved from them
        choice = resolve_precision(args.precision, args.teacher_dtype, probe_hardware(args.device))
        args.precision, args.teacher_dtype = choice.precision, choice.teacher_dtype
        args.precision_reason = choice.reason
    if args.quick:  # a check that everything runs, not figures to quote
        args.seq, args.warmup, args.repeats, args.loss_repeats = 128, 1, 1, 1
    if args.scenario is None and args.loss_tokens is None:
        if args.out is None:
            parser.error("--out DIR is required")
        check(args)  # once, in the parent: its children are handed the checked values
    return args


def setting_errors(args: argparse.Namespace) -> list[str]:
    """``--precision``, ``--teacher-dtype`` and ``--device``, by ``train``'s own checks (each was a
    traceback, some from a child process)."""
    errors = device_errors(args.device, "--device")
    precision = f"--precision {args.precision}"
    if not (wrong := choice_errors(args.precision, precision)):
        on_cpu = str(args.device).startswith("cpu")
        wrong = fp16_autocast_errors(
            args.precision, on_cpu, f"{precision} on a CPU", "--precision "
        )
    try:
        check_dtype(args.teacher_dtype, "--teacher-dtype", (AUTO,))
    except ValueError as error:
        wrong.append(str(error))
    return errors + wrong


def depth_errors(args: argparse.Namespace) -> list[str]:
    """``--student-layers`` against the teacher's depth, read from its config alone."""
    count = args.student_layers
    if not isinstance(count, int) or count < 1:  # the option rules name it
        return []
    try:
        depth = spec_config(TeacherSpec(args.teacher)).num_hidden_layers
    except (ValueError, OSError, AttributeError):  # the teacher's own check names why
        return []
    try:
        check_num_layers(count, depth, "--student-layers")
    except ValueError as error:
        return [str(error)]
    return []


def check(args: argparse.Namespace) -> None:
    """The numbers every scenario uses, ``--seq`` against the teacher's positions, and ``--out``
    (a directory, created if missing; not a file), before any child loads a model."""
    numbers = {
        "--student-layers": args.student_layers,
        "--batch": args.batch,
        "--seq": args.seq,
        "--warmup": args.warmup,
        "--repeats": args.repeats,
        "--loss-repeats": args.loss_repeats,
    }
    teacher = {f"--teacher {args.teacher}": lambda: teacher_positions(TeacherSpec(args.teacher))}
    check_entry(
        command="bench",
        options=numbers,
        lengths=[Length("--seq", args.seq, teacher)],
        extra=out_dir_errors("--out", args.out) + depth_errors(args),
    )


def main(argv: Sequence[str] | None = None) -> dict | None:
    """Run the benchmark (or, with the hidden ``--scenario``/``--loss-tokens``, one child)."""
    return runner.run(parse(argv))
