"""Peak memory of a streamed run on a corpus N times the embedded one, beside the same run on 1×.

python scripts/stream_memory.py [--scale 10] [--steps 200] [--map-style] [--out stream_memory]

Writes the embedded corpus (both files, 303 documents) once and ``--scale`` times (each copy's
documents marked, so none repeats) as JSON lines, trains ``debug=smoke`` for ``--steps`` steps
from each with ``data.streaming=true`` (``data.dataset.path=json``), and prints each run's peak
resident memory (the child's ``ru_maxrss``: the whole process, imports and models included) and
the ratio. ``--map-style`` adds the same two runs read whole (``data.streaming=false``), to show
what the measurement sees when the corpus is held in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lightning_kd.data.reading import DEFAULT_FILES, read_documents  # noqa: E402


def write_corpus(path: Path, copies: int) -> int:
    """The embedded corpus ``copies`` times as JSON lines at ``path``; its size in bytes."""
    texts = [text for path in DEFAULT_FILES for text in read_documents(path)]
    with open(path, "w") as handle:
        for copy in range(copies):
            for text in texts:
                handle.write(json.dumps({"text": f"(copy {copy}) {text}"}) + "\n")
    return path.stat().st_size


def peak_rss_mb(corpus: Path, steps: int, streaming: bool, run_dir: Path) -> tuple[float, float]:
    """Train ``debug=smoke`` from ``corpus`` in a child process; its peak RSS (MB) and seconds."""
    overrides = [
        "debug=smoke",
        "data.dataset.path=json",
        f"data.dataset.data_files={corpus}",
        f"data.streaming={str(streaming).lower()}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "validate_before=false",
        "export_student=false",
        "~callbacks.progress",
        "+trainer.enable_progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]
    command = [sys.executable, "-m", "lightning_kd", "train", *overrides]
    env = {**os.environ, "HF_DATASETS_CACHE": str(run_dir.parent / "hf_datasets")}
    env |= {"LIGHTNING_KD_CACHE": str(run_dir.parent / "lightning_kd"), "OMP_NUM_THREADS": "1"}
    env |= {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed: exit {os.waitstatus_to_exitcode(status)}")
    return usage.ru_maxrss / 1024, time.perf_counter() - started  # ru_maxrss: KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--map-style", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("stream_memory"))
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    corpora = {1: out / "corpus_x1.jsonl", args.scale: out / f"corpus_x{args.scale}.jsonl"}
    sizes = {scale: write_corpus(path, scale) for scale, path in corpora.items()}
    modes = [True, False] if args.map_style else [True]
    rows = {}
    for streaming in modes:
        for scale, path in corpora.items():
            name = f"{'streamed' if streaming else 'map-style'} x{scale}"
            run_dir = out / name.replace(" ", "_")
            rows[name] = peak_rss_mb(path, args.steps, streaming, run_dir)
            peak, seconds = rows[name]
            megabytes = sizes[scale] / 2**20
            print(f"{name}: {megabytes:.1f} MB corpus, peak RSS {peak:.0f} MB ({seconds:.0f} s)")
    for streaming in modes:
        kind = "streamed" if streaming else "map-style"
        small, large = rows[f"{kind} x1"][0], rows[f"{kind} x{args.scale}"][0]
        print(
            f"{kind}: peak RSS x{args.scale} / x1 = {large / small:.3f} ({large - small:+.0f} MB)"
        )
    (out / "stream_memory.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
