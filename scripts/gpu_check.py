"""GPU check: the smoke config under fsdp, deepspeed (ZeRO-3) and ddp, bf16, on one CUDA device.

    python scripts/gpu_check.py [--out DIR]

Each strategy runs as its own ``python run.py`` (a fresh process and CUDA context) with
``trainer.precision=bf16-mixed teacher.dtype=bfloat16``, in two scenarios: ``plain`` (the smoke
config) and ``on_policy`` (chat rows, mixed on-policy KD at λ 0.5 — the student generates inside
the sharded step — with 2 accumulated micro-batches per step, DeepSpeed's own accumulation
path); the table prints each run's exit status,
final student perplexity and peak CUDA memory (``torch.cuda.max_memory_allocated``, written by the
run to its summary.json), and checks that each last checkpoint holds the student and no teacher
weights. DeepSpeed comes with the ``dev`` extras (``pip install -e ".[deepspeed]"`` alone).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "fsdp", "deepspeed")
SCENARIOS = ("plain", "on_policy")
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def scenario_overrides(scenario: str, out: Path) -> list[str]:
    """The overrides of ``scenario`` (its chat rows and template written under ``out``)."""
    if scenario == "plain":
        return []
    rows, template = out / "chats.jsonl", out / "chatml.jinja"
    template.write_text(CHATML)
    with rows.open("w") as handle:
        for i in range(64):
            row = {"prompt": f"Count to {i % 9 + 1}.", "completion": f"{i}, said the model."}
            handle.write(json.dumps(row) + "\n")
    return [
        "data=chat",
        f"data.files=[{rows}]",
        f"data.chat_template={template}",
        "data.block_size=160",
        "distill.on_policy=0.5",
        "distill.on_policy_tokens=8",
        "trainer.accumulate_grad_batches=2",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="gpu-check-")))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: run this on a GPU machine")
        return 2
    rows, failed = [], 0
    args.out.mkdir(parents=True, exist_ok=True)
    for scenario in args.scenarios:
        for strategy in args.strategies:
            row = run_one(strategy, scenario, args.out)
            failed += row[2] != "ok"
            rows.append(row)
    print("| strategy | scenario | status | student ppl | peak CUDA MB |")
    print("|---|---|---|---:|---:|")
    for strategy, scenario, status, ppl, peak in rows:
        ppl_text = "—" if ppl is None else f"{ppl:.2f}"
        peak_text = "—" if peak is None else f"{peak:.0f}"
        print(f"| {strategy} | {scenario} | {status} | {ppl_text} | {peak_text} |")
    print(f"logs: {args.out}")
    return 1 if failed else 0


def run_one(strategy: str, scenario: str, out: Path) -> tuple:
    """One ``python run.py`` of the smoke config under ``strategy`` in ``scenario``: (strategy,
    scenario, status, student perplexity, peak CUDA MB)."""
    run_dir = out / f"{strategy}-{scenario}"
    command = [
        sys.executable,
        "run.py",
        "debug=smoke",
        f"strategy={strategy}",
        "trainer.accelerator=gpu",
        "trainer.devices=1",
        "trainer.precision=bf16-mixed",
        "teacher.dtype=bfloat16",
        *scenario_overrides(scenario, out),
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (out / f"{strategy}-{scenario}.log").write_text(result.stdout + result.stderr)
    summary = run_dir / "summary.json"
    if result.returncode != 0 or not summary.is_file():
        return strategy, scenario, f"failed: {last_error(result.stderr)}", None, None
    data = json.loads(summary.read_text())
    status = checkpoint_status(run_dir / "checkpoints" / "last.ckpt")
    return strategy, scenario, status, data["after"].get("val/ppl"), data.get("peak_cuda_mb")


def checkpoint_status(path: Path) -> str:
    """ "ok" if the run's last checkpoint holds the student and no teacher weights.

    A file is Lightning's full state dict (single device, DDP, FSDP); DeepSpeed writes a directory
    whose model states exclude frozen parameters, so its size is what can be checked here.
    """
    from lightning_kd.training.checkpoints import (
        STUDENT_PREFIX,
        TEACHER_PREFIX,
        load_local,  # weights_only=True, as a resume loads it
    )

    if path.is_file():
        keys = load_local(path, map_location="cpu")["state_dict"].keys()
        if any(key.startswith(TEACHER_PREFIX) for key in keys):
            return "checkpoint holds teacher weights"
        if not any(key.startswith(STUDENT_PREFIX) for key in keys):
            return "checkpoint lacks student weights"
        return "ok"
    if path.is_dir():
        return "ok" if any(path.rglob("*model_states.pt")) else "checkpoint has no model states"
    return "no checkpoint written"


def last_error(stderr: str) -> str:
    """The last line of a failed run that says something (not Hydra's HYDRA_FULL_ERROR hint)."""
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and "HYDRA_FULL_ERROR" not in line
    ]
    # The exception's own line, where there is one: Hydra's hint follows it after a blank line,
    # which left this table empty on an H200.
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    found = errors or lines
    return found[-1][:200] if found else "no output"


if __name__ == "__main__":
    sys.exit(main())
