"""What a run reports at the end: a timer for the training loop and the summary table."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch import Callback, LightningModule, Trainer

from lightning_kd.evaluation.harness import markdown as harness_markdown
from lightning_kd.models.layer_scores import Ranking
from lightning_kd.training.rundir import HYDRA_OWN, OUTPUTS
from lightning_kd.training.summary_rows import (
    CACHED,
    ROWS,
    TEACHER_ROWS,
    per_teacher,
    precision_text,
    teacher_rows,
    worse_than_before,
)


class TrainTimer(Callback):
    """Wall time spent in training batches (validation, data loading and checkpoint writes
    excluded), for the summary's tokens/s; and on that clock, the throughput logged as
    ``throughput/…`` (Lightning's ``Throughput``: batches, samples and tokens per second, per
    device and, on several devices, in all, over the last ``window`` batches).

    Not Lightning's ``ThroughputMonitor``: its clock runs from the start of training minus
    validation, so it counts data loading and checkpoint writes, and reading it back needs its
    private state; it logs validation throughput at a step that counts validation batches (rows
    at meaningless steps in the one ``metrics.csv`` a resumed run appends to, dropping rows by
    step); and it warns on every run unless the module defines ``flops_per_batch``.
    """

    def __init__(self, window: int = 10) -> None:
        self.seconds = 0.0
        self.window = window
        self.throughput = Throughput(window_size=window)
        self._start: float | None = None
        self._batches = self._samples = self._tokens = 0
        self.tokens_at_start = 0

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.throughput = Throughput(world_size=trainer.world_size, window_size=self.window)
        self.tokens_at_start = getattr(pl_module, "tokens_seen", 0)  # a resume with no steps left

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A resumed module's count starts at the checkpoint's: only what follows is timed here.
        self.tokens_at_start = getattr(pl_module, "tokens_seen", 0)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if self._start is None:
            return
        self.seconds += time.perf_counter() - self._start
        self._start = None
        self._batches += 1
        self._samples += len(batch["input_ids"])
        self._tokens += int(batch["attention_mask"].sum())
        self.throughput.update(
            time=self.seconds, batches=self._batches, samples=self._samples, lengths=self._tokens
        )
        rates = {
            f"throughput/{name.replace('items', 'tokens')}": value
            for name, value in self.throughput.compute().items()
            if name.endswith("_per_sec")
        }
        if rates:  # once ``window`` batches have run
            pl_module.log_dict(rates, on_step=True, on_epoch=False)


def fixed(value: float | None, digits: int) -> str:
    """``value`` to ``digits`` decimals: ``—`` where the run did not measure it."""
    return "—" if value is None else f"{value:.{digits}f}"


def rate(value: float | None) -> str:
    """A throughput for the table: ``—`` when nothing was timed (a resume with no steps left)."""
    return "—" if value is None else f"{value:.0f}"


@dataclass
class RunSummary:
    """The figures a run ends with; ``before``/``after`` are validation metrics by name."""

    after: dict[str, float]
    before: dict[str, float] = field(default_factory=dict)
    teacher_ppl: float | None = None
    steps: int = 0
    train_tokens: int = 0
    train_seconds: float = 0.0
    timed_tokens: int | None = None
    """The tokens trained in ``train_seconds`` (this process's share of a resumed run's)."""
    wall_seconds: float = 0.0
    peak_cuda_mb: float | None = None
    """``torch.cuda.max_memory_allocated`` of this process, on a GPU."""
    precision: dict[str, str] | None = None
    """The resolved ``trainer.precision`` and ``teacher.dtype``, and why (``auto`` or explicit);
    ``student.dtype`` where not float32, ``quantize`` when the teacher's weights are quantized
    (``teacher.quantize``), and ``[<name>]``'s for a ``teachers`` entry held otherwise."""
    importance: dict | None = None
    """With ``student.layers=importance``: the layer scores and the layers kept
    (``layer_scores.Ranking.as_dict``)."""
    teacher_cache: dict | None = None
    """The teacher group's cache trained from, given (``distill.teacher_cache=DIR``) or found
    by ``auto``, and why; None: online (``launch.teacher_cache.CacheChoice.as_dict``)."""
    entry_caches: dict[str, dict] = field(default_factory=dict)
    """``teachers`` entries with ``cache: auto``: each one's cache or online, and why, by name."""
    blockwise: dict | None = None
    """With ``distill.blockwise_passes``: what the repair did (``repair.RepairReport.as_dict``)."""
    lm_eval: list[dict] | None = None
    """With ``lm_eval.tasks``: lm-eval's scores of the exported student (and the teacher's, first),
    a row per model (``evaluation.harness.score_models``)."""
    stopped_early: str | None = None
    """Why training ended before ``trainer.max_steps``: an early-stopping callback's reason
    (Lightning's), or ``trainer.max_time``'s, with the step; None where it ran to its end."""
    stopped_by: str | None = None
    """What ended it so: ``early_stopping`` (the run is finished) or ``max_time`` (it is not:
    ``ckpt_path=last`` with a larger ``trainer.max_time`` goes on)."""
    best: dict | None = None
    """``checkpoint.best``'s checkpoint: its ``metric``, ``value`` and ``step``, and where its
    ``student`` is (``student-best``; ``student`` where it is the final one)."""
    written: dict[str, dict] = field(default_factory=dict)
    """What the run left on disk: ``{what: {"path": ..., "bytes": ...}}`` (:func:`disk_use`)."""

    def __post_init__(self) -> None:
        # A resume that reuses the validation its checkpoint records (stopped after training's
        # last step) validates nothing: the teacher's perplexity is that validation's.
        if self.teacher_ppl is None:
            found = self.after.get("val/teacher_ppl", self.before.get("val/teacher_ppl"))
            self.teacher_ppl = None if found is None else float(found)

    @property
    def tokens_per_second(self) -> float | None:
        """Training throughput of this process (None when it trained no step)."""
        tokens = self.train_tokens if self.timed_tokens is None else self.timed_tokens
        return tokens / self.train_seconds if self.train_seconds and tokens else None

    @property
    def launch(self) -> str:
        """``, this launch`` where the run resumed: its time and rate are the last launch's
        (they read as the whole run's; probe 47)."""
        resumed = self.timed_tokens is not None and self.timed_tokens != self.train_tokens
        return ", this launch" if resumed else ""

    @property
    def worse(self) -> str | None:
        """Why the student ends worse than it started, if it does (``summary_rows``)."""
        return worse_than_before(self.before, self.after)

    def as_dict(self) -> dict:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second, "worse": self.worse}

    def metric_rows(self) -> list[tuple[str, str, str]]:
        """The validation rows: the teacher's figures, then each metric before and after."""
        rows = []
        several = any(per_teacher(key, self.after) for key in TEACHER_ROWS)
        whose = " of the teacher group's model" if several else ""  # not the others'
        if self.teacher_ppl is not None:
            rows.append((f"teacher perplexity (val){whose}", fixed(self.teacher_ppl, 2), ""))
        # Comparable across tokenizers, and the one teacher figure a teacher of another
        # tokenizer than the student's has: it has no perplexity of the student's tokens.
        bpb = self.after.get("val/teacher_bpb", self.before.get("val/teacher_bpb"))
        if bpb is not None:
            rows.append((f"teacher bits per byte (val){whose}", fixed(bpb, 4), ""))
        rows += [  # the other teachers' (teachers.py: over the validation rows each teaches)
            (f"teachers[{key.split('/', 2)[2]}] bits per byte (val)", fixed(value, 4), "")
            for key, value in {**self.before, **self.after}.items()
            if key.startswith("val/teacher_bpb/")
        ]
        # The cache's top k alone: not where auto chose the teacher online (probe 48).
        from_cache = (self.teacher_cache or {}).get("distill.teacher_cache") is not None
        cached = CACHED if from_cache else {}
        names = {self.teacher_cache.get("name")} if from_cache else set()
        names |= {n for n, c in self.entry_caches.items() if c.get("distill.teacher_cache")}
        return rows + [
            (
                cached.get(key, label),
                fixed(self.before.get(key), digits),
                fixed(self.after.get(key), digits),
            )
            for key, label, digits in [*ROWS, *teacher_rows(self.after, names)]
            if key in self.after and not per_teacher(key, self.after)
        ]

    def markdown(self) -> str:
        """The summary as a markdown table (also what the console shows)."""
        rows = self.metric_rows()
        rows += [("worse than before training", "", self.worse)] if self.worse else []
        rows += [
            ("optimizer steps", "", str(self.steps)),
            *([("stopped early", "", self.stopped_early)] if self.stopped_early else []),
            ("training tokens", "", str(self.train_tokens)),
            (f"tokens/s (training{self.launch})", "", rate(self.tokens_per_second)),
            (f"wall time (s{self.launch})", "", f"{self.wall_seconds:.1f}"),
        ]
        if self.precision is not None:
            rows.append(("precision", "", precision_text(self.precision)))
        if self.teacher_cache is not None:
            rows.append(("teacher in training", "", self.teacher_cache["in_training"]))
        rows += [
            (f"teachers[{name}] in training", "", choice["in_training"])
            for name, choice in self.entry_caches.items()
        ]
        if self.blockwise is not None:
            repaired = f"{self.blockwise['passes']} passes, {self.blockwise['seconds']:.1f} s"
            rows.append(("block-wise repair before training", "", repaired))
        if self.best is not None:
            best = f"step {self.best['step']}, {self.best['metric']} {self.best['value']:.6g}"
            rows.append(("best checkpoint", "", f"{best}: {self.best['student']}"))
        if self.peak_cuda_mb is not None:
            rows.append(("peak CUDA memory (MB)", "", f"{self.peak_cuda_mb:.0f}"))
        if self.importance is not None:
            kept = ", ".join(map(str, self.importance["kept"]))
            rows.append((f"student layers (by {self.importance['by']})", "", kept))
        rows += [
            (f"written: {what}", "", f"{entry['bytes'] / 2**20:.1f} MB in {entry['path']}")
            for what, entry in self.written.items()
        ]
        lines = ["| | before | after |", "|---|---:|---:|"]
        lines += [f"| {name} | {before} | {after} |" for name, before, after in rows]
        if self.importance is not None:
            lines += ["", "Teacher layer scores:", "", Ranking.from_dict(self.importance).table()]
        if self.lm_eval:
            lines += ["", "lm-eval on the exported student:", "", harness_markdown(self.lm_eval)]
        return "\n".join(lines)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a file's own size; 0 if it does not exist), each file
    once however many hard links name it, as ``du`` counts: ``checkpoint.keep``'s checkpoints
    are links to ``last.ckpt`` and took no more room."""
    files = [path] if path.is_file() else path.rglob("*") if path.is_dir() else []
    sizes = {}
    for file in files:
        if file.is_file():
            status = file.stat()
            sizes[status.st_dev, status.st_ino] = status.st_size
    return sum(sizes.values())


def run_bytes(run_dir: Path) -> int:
    """Bytes of what a run writes into ``run_dir`` (``rundir.OUTPUTS``, Hydra's record and
    logs): not an earlier run's outputs ``overwrite=true`` set aside there until this run ends,
    nor files it found there (a user's notes, a cache written into the directory)."""
    if not run_dir.is_dir():
        return 0
    ours = (*OUTPUTS, *HYDRA_OWN)
    return sum(
        tree_bytes(entry)
        for entry in run_dir.iterdir()
        if entry.name in ours or entry.name.endswith(".log")
    )


def disk_use(
    output_dir: Path, cache: dict | None = None, entry_caches: dict[str, dict] | None = None
) -> dict[str, dict]:
    """What a run wrote: its run directory (checkpoints, the exported student and its GGUFs
    named apart) and, where it wrote into a teacher cache, those bytes and its path (each
    ``teachers`` entry's too, by name; a cache it only read is not listed)."""
    written = {"run directory": {"path": str(output_dir), "bytes": run_bytes(output_dir)}}
    for part in ("checkpoints", "student", "student-best"):
        if (output_dir / part).exists():
            written[part] = {"path": str(output_dir / part), "bytes": tree_bytes(output_dir / part)}
    for gguf in sorted(output_dir.glob("student.*.gguf")):  # export.gguf's files
        written[gguf.name] = {"path": str(gguf), "bytes": gguf.stat().st_size}
    caches = {"teacher cache": cache} | {
        f"teacher cache ({name})": choice for name, choice in (entry_caches or {}).items()
    }
    for what, choice in caches.items():  # a cache only read (0 bytes) is not listed as written
        if (
            choice is not None
            and choice.get("distill.teacher_cache")
            and choice.get("written_bytes")
        ):
            path = choice["distill.teacher_cache"]
            written[what] = {"path": path, "bytes": choice["written_bytes"]}
    return written
