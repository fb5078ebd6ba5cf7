"""GPU check: the smoke config under fsdp, deepspeed (ZeRO-3) and ddp, bf16, on one CUDA device.

    python scripts/gpu_check.py [--out DIR]

Each strategy runs as its own ``python run.py`` (a fresh process and CUDA context) with
``trainer.precision=bf16-mixed teacher.dtype=bfloat16``; the table prints each run's exit status,
final student perplexity and peak CUDA memory (``torch.cuda.max_memory_allocated``, written by the
run to its summary.json). DeepSpeed must be installed (``pip install deepspeed``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "fsdp", "deepspeed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="gpu-check-")))
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    args = parser.parse_args()
    rows, failed = [], 0
    for strategy in args.strategies:
        run_dir = args.out / strategy
        command = [
            sys.executable,
            "run.py",
            "debug=smoke",
            f"strategy={strategy}",
            "trainer.accelerator=gpu",
            "trainer.devices=1",
            "trainer.precision=bf16-mixed",
            "teacher.dtype=bfloat16",
            f"hydra.run.dir={run_dir}",
        ]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        (args.out / f"{strategy}.log").write_text(result.stdout + result.stderr)
        summary = run_dir / "summary.json"
        if result.returncode == 0 and summary.is_file():
            data = json.loads(summary.read_text())
            rows.append((strategy, "ok", data["after"].get("val/ppl"), data.get("peak_cuda_mb")))
        else:
            failed += 1
            rows.append(
                (strategy, f"failed ({result.stderr.strip().splitlines()[-1:]})", None, None)
            )
    print("| strategy | status | student ppl | peak CUDA MB |\n|---|---|---:|---:|")
    for strategy, status, ppl, peak in rows:
        ppl_text = "—" if ppl is None else f"{ppl:.2f}"
        peak_text = "—" if peak is None else f"{peak:.0f}"
        print(f"| {strategy} | {status} | {ppl_text} | {peak_text} |")
    print(f"logs: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
