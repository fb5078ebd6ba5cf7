"""Memory and speed of a KD step against its floor, side by side: ``lightning-kd bench --out DIR``.

Each scenario runs in a fresh process of its own and is measured after its warm-up: peak memory
is the high-water mark of the timed steps (peak RSS, ``VmHWM``, on the CPU;
``torch.cuda.max_memory_allocated`` on a GPU), step time their median. All use the same teacher,
student, batch and optimizer (AdamW), and every scenario first reads all weights once, so the
memory-mapped ones are resident in each (the floor holds the teacher it never runs):

- ``floor``        the student's own CE step (HF loss on full logits), teacher weights resident
- ``teacher``      the teacher's forward alone, under no_grad (full logits)
- ``teacher_int8`` the same with ``teacher.quantize=int8`` (skipped without torchao, the
                   ``quantize`` extra)
- ``naive``        KD as often written: the teacher's graph kept, every hidden state returned,
                   full-logit KL
- ``full_logits``  lightning_kd with ``distill.chunked=false``: lean teacher, full-logit KL
- ``lightning_kd`` lightning_kd's step: lean teacher, chunked logit distillation
- ``lora``         the same step on a LoRA student (``student.lora``'s defaults): adapters train
                   (skipped without peft, the ``lora`` extra)

- ``free_floor``   the teacher-free floor: lightning_kd's CE-only step (``distill.kd_weight=0``)
                   with no teacher weights in the process
- ``cached``       lightning_kd's KD step from the teacher's top-k records (``cache.k``, as
                   ``lightning-kd cache`` writes them), no teacher weights in the process
- ``on_policy``    lightning_kd's step with ``distill.on_policy=1``: the student first samples a
                   completion of each row's first half (at most the other half's tokens), then
                   the KD step scores them; the sampling is also timed alone
- ``interleaved``  the same, the teacher vetoing each sampled token outside its top 25 (speculative
                   KD, ``distill.on_policy_teacher_top_k``): two models decode
- ``logits_only``  lightning_kd's step with ``distill.features=null``: the next three's baseline
- ``cross_tokenizer`` the same step through the cross-tokenizer path on the teacher's own
                   tokenizer (``distill.cross_tokenizer=always``): each batch decoded to bytes,
                   re-tokenised, aligned, the teacher's top 64 taken at aligned positions
- ``cross_spans``  that step with the span term (``distill.cross_span_weight=1``)
- ``two_teachers`` the teacher twice (``teachers``, half the weight each): what a second teacher
                   adds to a step's memory and time


Then a loss-only sweep at vocab 49152 (full-logit vs chunked forward + backward over 512, 2048 and
8192 tokens). Writes ``bench.json`` (with ``mem_ratio_vs_floor``, ``time_ratio_vs_parts``,
``loss_mem_ratio_vs_full``, ``lora_vs_full`` — the LoRA step's trainable parameters, memory and
time over lightning_kd's — ``cached_{mem,time}_ratio_vs_free_floor`` and ``on_policy``: the
share of the on-policy step spent sampling, ``generation_share``, and ``interleaved``: the same for
interleaved sampling), ``cross_tokenizer_vs_logits_only`` (memory and time),
``cross_spans_vs_cross_tokenizer`` (the same, the span term's step over the cross-tokenizer one)
and ``second_teacher`` (the MB and seconds it adds against ``logits_only``); ``bench.md`` and
``bench.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable

from lightning_kd.bench.loss import LOSS_TOKENS, QUICK_LOSS_TOKENS, run_loss
from lightning_kd.bench.report import markdown, plot, summarise
from lightning_kd.bench.scenarios import SCENARIOS, run_scenario
from lightning_kd.models.lora import missing_peft
from lightning_kd.models.quantize import DTYPES as QUANTIZABLE
from lightning_kd.models.quantize import missing_torchao
from lightning_kd.utils import starting
from lightning_kd.utils.atomic import atomic_write_bytes


def int8_unavailable(args: argparse.Namespace) -> str | None:
    """Why ``teacher_int8`` cannot run with ``args``: no torchao, or a teacher dtype torchao
    does not quantize (float64 failed in the child, after the other scenarios, with no report)."""
    if args.teacher_dtype not in QUANTIZABLE:
        return f"--teacher-dtype {args.teacher_dtype}: int8 quantizes float32, bfloat16 or float16"
    return missing_torchao("int8")


OPTIONAL: dict[str, Callable[[argparse.Namespace], str | None]] = {
    "teacher_int8": int8_unavailable,
    "lora": lambda args: missing_peft(),
}
"""Scenarios that cannot always run here: why (None: they can), for an optional package or a
setting. Skipped in the parent, since the child would fail after its models load."""

# This module is the driver (child processes, output files); its options are parsed in
# lightning_kd.cli.bench, what each child measures is in scenarios.py, the report in report.py,
# the measuring itself in measure.py. The docstring above is the --help text.


def child(args: argparse.Namespace, *extra: str) -> dict | list[dict]:
    """Run measurements in a fresh process and return its JSON result."""
    command = [sys.executable, "-m", "lightning_kd", "bench", *extra, *forwarded(args)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"bench child {extra} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def forwarded(args: argparse.Namespace) -> list[str]:
    """The parent's settings as a child's options (precision already resolved, no ``--out``)."""
    options = ["--device", args.device, "--batch", str(args.batch), "--seq", str(args.seq)]
    options += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    options += ["--loss-repeats", str(args.loss_repeats), "--teacher", args.teacher]
    options += ["--teacher-dtype", args.teacher_dtype, "--precision", args.precision]
    options += ["--student-layers", str(args.student_layers)]
    flags = {"--quick": args.quick, "--no-compile": not args.compile}
    return options + [flag for flag, on in flags.items() if on]


def run(args: argparse.Namespace) -> dict | None:
    """A child's measurements as one JSON line, or, in the parent, every child and the report
    (``bench.json``, ``bench.md``, ``bench.png`` under ``args.out``)."""
    if args.scenario is not None:
        print(json.dumps(run_scenario(args.scenario, args)))
        return None
    if args.loss_tokens is not None:
        rows = [run_loss(tokens, args.chunked, args) for tokens in args.loss_tokens]
        print(json.dumps(rows))
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    scenarios: dict[str, dict] = {}
    try:
        measure_scenarios(args, scenarios)
    except (KeyboardInterrupt, starting.Terminated):
        print(f"stopped: the {len(scenarios)} scenarios measured are in {args.out / PARTIAL}")
        raise
    # One process per loss path, token counts in rising order; each measurement starts from a
    # trimmed heap, so the sweep costs two process start-ups, not six.
    tokens = [str(count) for count in (QUICK_LOSS_TOKENS if args.quick else LOSS_TOKENS)]
    losses = []
    for path in ([], ["--chunked"]):
        started = time.perf_counter()
        rows = child(args, "--loss-tokens", *tokens, *path)
        elapsed = time.perf_counter() - started
        sizes = ", ".join(f"{row['loss_mb']:.0f}" for row in rows)
        print(f"{'loss ' + ('chunked' if path else 'full'):>13}: {sizes} MB ({elapsed:.0f} s)")
        losses += rows
    report = summarise(scenarios, losses, args)
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (args.out / "bench.md").write_text(table + "\n")
    plot(report, args.out / "bench.png")
    (args.out / PARTIAL).unlink(missing_ok=True)  # the whole report holds them
    print("\n" + table)
    return report


PARTIAL = "bench.partial.json"
"""The scenarios measured so far, kept as each ends: a bench stopped (Ctrl+C, SIGTERM) wrote
nothing, and the minutes of the scenarios it had measured were lost."""


def measure_scenarios(args: argparse.Namespace, scenarios: dict[str, dict]) -> None:
    """Each scenario in a child process, into ``scenarios`` and ``args.out/bench.partial.json``
    as it ends."""
    for name in SCENARIOS:
        if name in OPTIONAL and (missing := OPTIONAL[name](args)):
            print(f"{name:>13}: skipped ({missing})")
            continue
        started = time.perf_counter()
        row = scenarios[name] = child(args, "--scenario", name)
        elapsed = time.perf_counter() - started
        print(f"{name:>13}: {row['peak_mb']:.0f} MB, {row['step_s']:.2f} s/step ({elapsed:.0f} s)")
        kept = json.dumps({"scenarios": scenarios}, indent=2) + "\n"
        atomic_write_bytes(args.out / PARTIAL, kept.encode())
