"""The benchmark's options checked before any child process loads a model, and its precision
resolved once, as ``lightning-kd train`` resolves it (with its one warning): the children are
handed the concrete, checked values and resolve nothing again."""

from __future__ import annotations

import argparse

from lightning_kd.evaluation.harness import device_errors
from lightning_kd.launch.entry import Length, check_entry
from lightning_kd.launch.paths import out_dir_errors
from lightning_kd.launch.precision_checks import choice_errors, fp16_autocast_errors
from lightning_kd.models.loading import TeacherSpec, check_dtype
from lightning_kd.models.packaged import PACKAGED, missing_error
from lightning_kd.models.positions import spec_config, teacher_positions
from lightning_kd.models.precision import AUTO, probe_hardware, resolve_precision
from lightning_kd.models.student import check_num_layers


def prepare(args: argparse.Namespace) -> None:
    """Refuse bad options (all at once, each named as typed); resolve ``args.precision`` and
    ``args.teacher_dtype`` from the hardware, with ``args.precision_reason``."""
    check(args, setting_errors(args))  # before the precision is resolved from them
    choice = resolve_precision(args.precision, args.teacher_dtype, probe_hardware(args.device))
    args.precision, args.teacher_dtype = choice.precision, choice.teacher_dtype
    args.precision_reason = choice.reason


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


def check(args: argparse.Namespace, extra: list[str] = ()) -> None:
    """The numbers every scenario uses, ``--seq`` against the teacher's positions, a packaged
    teacher's packages, and ``--out`` (a directory, created if missing; not a file), before any
    child loads a model; refused with the ``extra`` problems, all at once."""
    numbers = {
        "--student-layers": args.student_layers,
        "--batch": args.batch,
        "--seq": args.seq,
        "--warmup": args.warmup,
        "--repeats": args.repeats,
        "--loss-repeats": args.loss_repeats,
    }
    teacher = {f"--teacher {args.teacher}": lambda: teacher_positions(TeacherSpec(args.teacher))}
    missing = missing_error(args.teacher, "--teacher") if args.teacher in PACKAGED else None
    check_entry(
        command="bench",
        options=numbers,
        lengths=[Length("--seq", args.seq, teacher)],
        extra=[*extra, *out_dir_errors("--out", args.out), *depth_errors(args)]
        + ([missing] if missing else []),
    )
