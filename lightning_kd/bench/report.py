"""The benchmark's report: ratios against the floor, the markdown table and the loss-memory plot,
from the rows :mod:`lightning_kd.bench.scenarios` measured."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def summarise(scenarios: dict[str, dict], losses: list[dict], args: argparse.Namespace) -> dict:
    """``bench.json``: each scenario against the floor and against (student step + teacher
    forward), and the chunked loss's memory against the full-logit one at the most tokens."""
    floor, teacher, ours = scenarios["floor"], scenarios["teacher"], scenarios["lightning_kd"]
    parts = floor["step_s"] + teacher["step_s"]
    most = max(row["tokens"] for row in losses)
    full_most = next(r for r in losses if r["tokens"] == most and not r["chunked"])
    chunked_most = next(r for r in losses if r["tokens"] == most and r["chunked"])
    for row in scenarios.values():
        row["mem_vs_floor"] = row["peak_mb"] / floor["peak_mb"]
        row["time_vs_parts"] = row["step_s"] / parts
    free, cached = scenarios["free_floor"], scenarios["cached"]
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
        "loss_mem_ratio_vs_full": chunked_most["loss_mb"] / max(full_most["loss_mb"], 1e-9),
        "loss_mem_ratio_tokens": full_most["tokens"],
        "lora_vs_full": {
            key: scenarios["lora"][key] / ours[key] for key in ("trainable", "peak_mb", "step_s")
        }
        if "lora" in scenarios  # skipped without peft
        else None,
        "cached_mem_ratio_vs_free_floor": cached["peak_mb"] / free["peak_mb"],
        "cached_time_ratio_vs_free_floor": cached["step_s"] / free["step_s"],
        **other_paths(scenarios),
        "on_policy": on_policy_summary(scenarios),
        "interleaved": on_policy_summary(scenarios, "interleaved"),
        "scenarios": scenarios,
        "loss_sweep": losses,
    }


def other_paths(scenarios: dict[str, dict]) -> dict:
    """The cross-tokenizer step over the logits-only step (same teacher, student, batch), the
    span term's over the cross-tokenizer step, and what a second teacher adds to it."""
    logits, cross = scenarios["logits_only"], scenarios["cross_tokenizer"]
    spans, two = scenarios["cross_spans"], scenarios["two_teachers"]
    return {
        "cross_tokenizer_vs_logits_only": {
            key: cross[key] / logits[key] for key in ("peak_mb", "step_s")
        },
        "cross_spans_vs_cross_tokenizer": {
            key: spans[key] / cross[key] for key in ("peak_mb", "step_s")
        },
        "second_teacher": {key: two[key] - logits[key] for key in ("peak_mb", "step_s")},
        "teachers": two.get("teachers", []),
    }


def on_policy_summary(scenarios: dict[str, dict], name: str = "on_policy") -> dict:
    """The on-policy step against lightning_kd's: the share of its time spent sampling, and its
    time over the dataset step's (the KD step after sampling scores rows of at most as many
    tokens)."""
    row, ours = scenarios[name], scenarios["lightning_kd"]
    return {
        "generation_share": row["sample_s"] / row["step_s"],
        "step_vs_lightning_kd": row["step_s"] / ours["step_s"],
        "sampled_tokens": row["sampled_tokens"],
    }


def markdown(report: dict) -> str:
    """``bench.md``: the scenarios' table, the loss sweep's table and the three ratios."""
    memory = "CUDA max allocated" if report["device"] != "cpu" else "peak RSS"
    lines = [
        f"| scenario | trainable params | {memory} (MB) | vs floor | step (s) | "
        "vs (student step + teacher fwd) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in report["scenarios"].items():
        ratio = "—" if name.startswith(("floor", "teacher")) else f"{row['time_vs_parts']:.2f}"
        params = "—" if name.startswith("teacher") else f"{row['trainable'] / 1e6:.2f}M"
        lines.append(
            f"| {name} | {params} | {row['peak_mb']:.0f} | {row['mem_vs_floor']:.2f} | "
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
    return "\n".join(lines + ratio_lines(report) + teacher_lines(report))


def teacher_lines(report: dict) -> list[str]:
    """``bench.md``'s table of each teacher's share of the ``two_teachers`` step."""
    if not report.get("teachers"):
        return []
    lines = [
        "",
        "Each teacher of the `two_teachers` step: its resident weights and its side of the step "
        "alone (forward and records)",
        "",
        "| teacher | source | weights (MB) | its side of the step (s) |",
        "|---|---|---:|---:|",
    ]
    for row in report["teachers"]:
        lines.append(
            f"| {row['name']} | {row['source']} | {row['weights_mb']:.0f} | {row['side_s']:.3f} |"
        )
    return lines


def lora_lines(report: dict) -> list[str]:
    """``bench.md``'s LoRA sentence (none where the scenario was skipped: no peft)."""
    if report.get("lora_vs_full") is None:
        return []
    ratios = report["lora_vs_full"]
    labels = (("params", "trainable"), ("memory", "peak_mb"), ("time", "step_s"))
    said = ", ".join(f"{label} {ratios[key]:.3f}×" for label, key in labels)
    return ["", f"LoRA over lightning_kd's full student: {said}"]


def ratio_lines(report: dict) -> list[str]:
    """``bench.md``'s sentences under the tables: each ratio, said."""
    lines = [
        "",
        f"mem_ratio_vs_floor {report['mem_ratio_vs_floor']:.3f}, "
        f"time_ratio_vs_parts {report['time_ratio_vs_parts']:.3f}, "
        f"loss_mem_ratio_vs_full ({report['loss_mem_ratio_tokens']} tokens) "
        f"{report['loss_mem_ratio_vs_full']:.3f}",
        *lora_lines(report),
        "",
        "From a teacher cache, no teacher weights in the process (against free_floor, the "
        f"CE-only step): memory {report['cached_mem_ratio_vs_free_floor']:.3f}, "
        f"time {report['cached_time_ratio_vs_free_floor']:.3f}",
        "",
        "Through the cross-tokenizer path (the teacher's own tokenizer, re-tokenised and "
        "aligned each step), over the logits-only step: memory "
        f"{report['cross_tokenizer_vs_logits_only']['peak_mb']:.3f}×, time "
        f"{report['cross_tokenizer_vs_logits_only']['step_s']:.3f}×; the span term "
        f"(distill.cross_span_weight) over that step: memory "
        f"{report['cross_spans_vs_cross_tokenizer']['peak_mb']:.3f}×, time "
        f"{report['cross_spans_vs_cross_tokenizer']['step_s']:.3f}×; a second teacher adds "
        f"{report['second_teacher']['peak_mb']:.0f} MB and "
        f"{report['second_teacher']['step_s']:.3f} s a step",
        "",
        "On-policy KD (every micro-batch the student's completions of half-row prompts, "
        f"{report['on_policy']['sampled_tokens']:.0f} tokens sampled per row): sampling takes "
        f"{report['on_policy']['generation_share']:.1%} of the step; the step takes "
        f"{report['on_policy']['step_vs_lightning_kd']:.2f}× lightning_kd's; interleaved "
        f"with the teacher's top-25 veto ({report['interleaved']['sampled_tokens']:.0f} tokens): "
        f"{report['interleaved']['generation_share']:.1%} of the step, "
        f"{report['interleaved']['step_vs_lightning_kd']:.2f}× lightning_kd's",
    ]
    return lines


def plot(report: dict, path: Path) -> None:
    """``bench.png``: the loss's memory against the token count, full logits and chunked."""
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
