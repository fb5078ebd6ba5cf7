"""Memory and speed of a KD step against its floor, side by side: ``python -m lightning_kd.bench``.

Each scenario runs in a fresh process of its own and is measured after its warm-up: peak memory
is the high-water mark of the timed steps (peak RSS, ``VmHWM``, on the CPU;
``torch.cuda.max_memory_allocated`` on a GPU), step time their median. All use the same teacher,
student, batch and optimizer (AdamW), and every scenario first reads all weights once, so the
memory-mapped ones are resident in each (the floor holds the teacher it never runs):

- ``floor``        the student's own CE step (HF loss on full logits), teacher weights resident
- ``teacher``      the teacher's forward alone, under no_grad (full logits)
- ``naive``        KD as often written: the teacher's graph kept, every hidden state returned,
                   full-logit KL
- ``full_logits``  lightning_kd with ``distill.chunked=false``: lean teacher, full-logit KL
- ``lightning_kd`` lightning_kd's step: lean teacher, chunked logit distillation

Then a loss-only sweep at vocab 49152 (full-logit vs chunked forward + backward over 512, 2048 and
8192 tokens). Writes ``bench.json`` (with ``mem_ratio_vs_floor``, ``time_ratio_vs_parts`` and
``loss_mem_ratio_vs_full``), ``bench.md`` and ``bench.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lightning_kd.precision import probe_hardware, resolve_precision

SCENARIOS = ("floor", "teacher", "naive", "full_logits", "lightning_kd")
LOSS_TOKENS = (512, 2048, 8192)
LOSS_VOCAB, LOSS_HIDDEN = 49152, 576


# ----------------------------------------------------------------------------- measuring


def rss_mb() -> float:
    """This process's resident memory now, in MB (Linux)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``), so that memory an
    earlier measurement freed but the allocator kept is neither counted nor silently reused."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory window (after warm-up, so one-off costs such as compiling the
    loss do not count): CUDA's peak stats, or Linux's VmHWM via ``/proc/self/clear_refs``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_mb(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak`: CUDA max allocated, or peak RSS (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with open("/proc/self/status") as handle:
        line = next(row for row in handle if row.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024  # kB


def current_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return rss_mb()


def timed(step, device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``step()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ----------------------------------------------------------------------------- scenarios


def build_distiller(args: argparse.Namespace, chunked: bool):
    """The distiller of ``python run.py`` (the same composed config) on ``--teacher``, with the
    benchmark's own student depth, precision and loss path."""
    from lightning_kd.config import compose_config
    from lightning_kd.launch import build_distiller as build

    cfg = compose_config(
        [
            f"teacher.path={args.teacher}",
            f"teacher.dtype={args.teacher_dtype}",
            f"student.num_layers={args.student_layers}",
            f"distill.chunked={chunked}",
            f"distill.compile={args.compile}",
        ]
    )
    return build(cfg)[0]


def fault_in(model: torch.nn.Module) -> None:
    """Read every parameter once, so its pages are resident before the measurement starts.

    Weights loaded from safetensors are memory-mapped: pages a scenario never reads (the
    teacher's, in ``floor``) would not count in its RSS, and the floor would be measured without
    the teacher it is defined to hold.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.sum().item()


def make_batch(vocab: int, batch: int, seq: int, device: torch.device) -> dict:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=generator).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    """One scenario's peak memory and median step time, in this process."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    distiller = build_distiller(args, chunked=name != "full_logits").to(device)
    teacher, student = distiller.teacher, distiller.student
    fault_in(distiller)
    batch = make_batch(teacher.config.vocab_size, args.batch, args.seq, device)
    # --quick warms up on a short batch: the one-time costs (kernel selection, lazy
    # initialisation) are paid, the seconds of a full-size step are not.
    warmup_batch = make_batch(teacher.config.vocab_size, 1, 32, device) if args.quick else batch
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    autocast = torch.autocast(
        device.type,
        dtype=torch.float16 if args.precision.startswith("16") else torch.bfloat16,
        enabled=args.precision.endswith("-mixed"),
    )

    def optimizer_step(loss: torch.Tensor) -> None:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def floor(batch: dict) -> None:
        with autocast:
            loss = student(**batch, use_cache=False).loss
        optimizer_step(loss)

    def teacher_forward(batch: dict) -> None:
        with torch.no_grad(), autocast:
            teacher(input_ids=batch["input_ids"], use_cache=False).logits.sum().item()

    def naive(batch: dict) -> None:
        with autocast:
            teacher_out = teacher(**batch, output_hidden_states=True, use_cache=False)
            student_out = student(**batch, output_hidden_states=True, use_cache=False)
            kd = F.kl_div(
                F.log_softmax(student_out.logits.float(), -1),
                F.log_softmax(teacher_out.logits.detach().float(), -1),
                log_target=True,
                reduction="batchmean",
            )
        optimizer_step(0.5 * kd + 0.5 * student_out.loss)
        del teacher_out  # the teacher's graph lived through the whole step

    def lightning_kd(batch: dict) -> None:
        with autocast:
            objective, sums = distiller(batch)
        optimizer_step(objective / sums.tokens)

    if name == "naive":  # the common mistake: a teacher that is not frozen keeps its graph
        teacher.requires_grad_(True)
    step = {
        "floor": floor,
        "teacher": teacher_forward,
        "naive": naive,
        "full_logits": lightning_kd,
        "lightning_kd": lightning_kd,
    }[name]
    for _ in range(args.warmup):
        step(warmup_batch)
    reset_peak(device)
    seconds = timed(lambda: step(batch), device, 0, args.repeats)
    return {"scenario": name, "peak_mb": peak_mb(device), "step_s": seconds}


def run_loss(tokens: int, chunked: bool, args: argparse.Namespace) -> dict:
    """Memory and time of the logit loss alone (forward + backward) at vocab 49152."""
    from lightning_kd.losses import get_divergence
    from lightning_kd.losses.chunked import OutputHead, chunked_distillation_sums
    from lightning_kd.losses.logits import LogitObjective, logit_distillation_sums

    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)

    def tensor(*shape: int, grad: bool = False) -> torch.Tensor:
        value = torch.randn(*shape, generator=generator).to(device) * 0.05
        return value.requires_grad_(grad)

    hidden, weight = (
        tensor(1, tokens, LOSS_HIDDEN, grad=True),
        tensor(LOSS_VOCAB, LOSS_HIDDEN, grad=True),
    )
    teacher_hidden, teacher_weight = tensor(1, tokens, LOSS_HIDDEN), tensor(LOSS_VOCAB, LOSS_HIDDEN)
    labels = torch.randint(0, LOSS_VOCAB, (1, tokens), generator=generator).to(device)
    divergence = get_divergence("forward_kl")

    def step(count: int = tokens) -> None:
        student_hidden, targets = hidden[:, :count], labels[:, :count]
        if chunked:
            objective, _ = chunked_distillation_sums(
                student_hidden,
                OutputHead(weight),
                teacher_hidden[:, :count],
                OutputHead(teacher_weight),
                targets,
                LogitObjective(divergence, 1.0, 0.5, 0.5),
                compile=args.compile,
            )
        else:
            with torch.no_grad():
                teacher_logits = teacher_hidden[:, :count] @ teacher_weight.T
            logits = student_hidden @ weight.T
            sums = logit_distillation_sums(logits, teacher_logits, targets, divergence)
            objective = 0.5 * sums.kd + 0.5 * sums.ce
        objective.backward()
        hidden.grad = weight.grad = None

    # Warm-up: allocator pools, kernel selection, the chunked loss's compile. --quick warms up on
    # a short slice: the compiled loss is shape-generic, so a few tokens pay its one-time cost.
    step(min(tokens, 64) if args.quick else tokens)
    release_free_memory()
    baseline = current_mb(device)
    reset_peak(device)
    seconds = timed(step, device, 0, args.loss_repeats)
    return {
        "tokens": tokens,
        "chunked": chunked,
        "loss_mb": max(peak_mb(device) - baseline, 0.0),
        "step_s": seconds,
    }


# ----------------------------------------------------------------------------- driver


def child(args: argparse.Namespace, *extra: str) -> dict | list[dict]:
    """Run measurements in a fresh process and return its JSON result."""
    command = [sys.executable, "-m", "lightning_kd.bench", *extra, *forwarded(args)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"bench child {extra} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def forwarded(args: argparse.Namespace) -> list[str]:
    options = ["--device", args.device, "--batch", str(args.batch), "--seq", str(args.seq)]
    options += ["--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    options += ["--loss-repeats", str(args.loss_repeats), "--teacher", args.teacher]
    options += ["--teacher-dtype", args.teacher_dtype, "--precision", args.precision]
    options += ["--student-layers", str(args.student_layers)]
    flags = {"--quick": args.quick, "--no-compile": not args.compile}
    return options + [flag for flag, on in flags.items() if on]


def summarise(scenarios: dict[str, dict], losses: list[dict], args: argparse.Namespace) -> dict:
    floor, teacher, ours = scenarios["floor"], scenarios["teacher"], scenarios["lightning_kd"]
    parts = floor["step_s"] + teacher["step_s"]
    full_8k = next(r for r in losses if r["tokens"] == max(LOSS_TOKENS) and not r["chunked"])
    chunked_8k = next(r for r in losses if r["tokens"] == max(LOSS_TOKENS) and r["chunked"])
    for row in scenarios.values():
        row["mem_vs_floor"] = row["peak_mb"] / floor["peak_mb"]
        row["time_vs_parts"] = row["step_s"] / parts
    return {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "settings": {
            "teacher": args.teacher,
            "teacher_dtype": args.teacher_dtype,
            "student_layers": args.student_layers,
            "batch": args.batch,
            "seq": args.seq,
            "precision": args.precision,
            "precision_reason": args.precision_reason,
            "compiled_loss": args.compile,
            "timed_steps": args.repeats,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "mem_ratio_vs_floor": ours["mem_vs_floor"],
        "time_ratio_vs_parts": ours["time_vs_parts"],
        "loss_mem_ratio_vs_full": chunked_8k["loss_mb"] / max(full_8k["loss_mb"], 1e-9),
        "scenarios": scenarios,
        "loss_sweep": losses,
    }


def markdown(report: dict) -> str:
    memory = "CUDA max allocated" if report["device"] != "cpu" else "peak RSS"
    lines = [
        f"| scenario | {memory} (MB) | vs floor | step (s) | vs (student step + teacher fwd) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, row in report["scenarios"].items():
        ratio = "—" if name in ("floor", "teacher") else f"{row['time_vs_parts']:.2f}"
        lines.append(
            f"| {name} | {row['peak_mb']:.0f} | {row['mem_vs_floor']:.2f} | "
            f"{row['step_s']:.2f} | {ratio} |"
        )
    lines += [
        "",
        "| loss alone, vocab 49152 | tokens | memory (MB) | time (s) |",
        "|---|---:|---:|---:|",
    ]
    for row in report["loss_sweep"]:
        kind = "chunked" if row["chunked"] else "full logits"
        lines.append(f"| {kind} | {row['tokens']} | {row['loss_mb']:.0f} | {row['step_s']:.3f} |")
    lines += [
        "",
        f"mem_ratio_vs_floor {report['mem_ratio_vs_floor']:.3f}, "
        f"time_ratio_vs_parts {report['time_ratio_vs_parts']:.3f}, "
        f"loss_mem_ratio_vs_full (8192 tokens) {report['loss_mem_ratio_vs_full']:.3f}",
    ]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for chunked, label in ((False, "full logits"), (True, "chunked (lightning_kd)")):
        rows = [r for r in report["loss_sweep"] if r["chunked"] == chunked]
        ax.plot([r["tokens"] for r in rows], [r["loss_mb"] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss memory (MB)")
    ax.set_title("KD loss memory at vocab 49152")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lightning_kd.bench", description=__doc__)
    parser.add_argument("--out", type=Path, help="directory for bench.json, bench.md, bench.png")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="128-token rows, warm-up on a short batch, one timed step (under 2 minutes)",
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
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--loss-tokens", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--chunked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bf16:
        args.precision = "bf16-mixed"
    # Resolved once, in the parent, as python run.py resolves it (with its one warning); the
    # children are handed the concrete values and resolve nothing again.
    if args.scenario is None and args.loss_tokens is None:
        choice = resolve_precision(args.precision, args.teacher_dtype, probe_hardware(args.device))
        args.precision, args.teacher_dtype = choice.precision, choice.teacher_dtype
        args.precision_reason = choice.reason
    if args.quick:  # a check that everything runs, in under two minutes here
        args.seq, args.warmup, args.repeats, args.loss_repeats = 128, 1, 1, 1
    if args.scenario is None and args.loss_tokens is None and args.out is None:
        parser.error("--out DIR is required")
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse(argv)
    if args.scenario is not None:
        print(json.dumps(run_scenario(args.scenario, args)))
        return None
    if args.loss_tokens is not None:
        rows = [run_loss(tokens, args.chunked, args) for tokens in args.loss_tokens]
        print(json.dumps(rows))
        return None
    args.out.mkdir(parents=True, exist_ok=True)
    scenarios = {}
    for name in SCENARIOS:
        started = time.perf_counter()
        row = scenarios[name] = child(args, "--scenario", name)
        elapsed = time.perf_counter() - started
        print(f"{name:>13}: {row['peak_mb']:.0f} MB, {row['step_s']:.2f} s/step ({elapsed:.0f} s)")
    # One process per loss path, token counts in rising order; each measurement starts from a
    # trimmed heap, so the sweep costs two process start-ups, not six.
    tokens = [str(count) for count in LOSS_TOKENS]
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
    print("\n" + table)
    return report


if __name__ == "__main__":
    main()
