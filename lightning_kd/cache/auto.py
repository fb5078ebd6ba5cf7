"""``distill.teacher_cache=auto``: run the teacher once per block when the run would run it more.

A run that passes over its training blocks E times runs the teacher E times on each. With ``auto``
it runs once per block instead: ``run.py`` writes the teacher's top-k records of every training
and validation block into ``RUN_DIR/teacher_cache`` (the writer of ``python -m lightning_kd.cache``,
``cache.k`` entries per position; with ``distill.features``, the mapped teacher modules' outputs
too, as ``cache.features`` writes them by default) and trains from them. A resumed run finds that
directory complete and writes nothing; an interrupted write is completed shard by shard.

``auto`` keeps the teacher online — and says why — where a cache saves nothing or cannot serve:
fewer than :data:`MIN_PASSES` passes over the data, an objective without the teacher's logits,
on-policy KD, the full-logit loss, a teacher that is not a causal LM, chat data,
or several processes (write their cache first with ``python -m lightning_kd.cache strategy=ddp``).
Elsewhere (the notebooks, the benchmark, ``DistillConfig`` itself) an unresolved ``auto`` is the
online teacher: only a run has a directory to write the cache into.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightning_kd.cache.__main__ import cached_teacher, fabric_for, report
from lightning_kd.cache.writer import write_cache

AUTO = "auto"
DIRECTORY = "teacher_cache"
"""Where ``auto`` writes the cache, inside the run directory."""
MIN_PASSES = 1.5
"""Passes over the training blocks from which caching pays: it costs one teacher forward per
block (and the top-k of its logits), online KD one per block per pass."""


@dataclass(frozen=True)
class CacheChoice:
    """What ``distill.teacher_cache`` resolved to, and why."""

    path: str | None
    """The cache trained from; None: the teacher runs online (or not at all in training)."""
    reason: str
    in_training: bool = True
    """False where the objective needs no teacher in training (CE-only): only validation runs it."""

    @property
    def where(self) -> str:
        if not self.in_training:
            return "not run in training"
        return "cached once" if self.path else "online"

    def line(self) -> str:
        where = f"cached once in {self.path}" if self.path else self.where
        return f"teacher: {where} ({self.reason})"

    def as_dict(self) -> dict[str, str | None]:
        return {
            "distill.teacher_cache": self.path,
            "reason": self.reason,
            "in_training": self.where,
        }


def unresolved(value: object) -> bool:
    """Whether ``distill.teacher_cache`` is ``auto`` (not yet resolved by a run)."""
    return value == AUTO


def why_online(cfg: DictConfig) -> str | None:
    """Why ``cfg`` trains with the teacher online whatever its length, or None."""
    distill, trainer = cfg.distill, cfg.trainer
    reasons = (
        (distill.kd_weight == 0, "distill.kd_weight=0: training uses no teacher logits"),
        (distill.get("on_policy", 0) > 0, "on-policy KD scores the student's own completions"),
        (not distill.get("chunked", True), "distill.chunked=false computes full teacher logits"),
        (cfg.teacher.get("task", "causal_lm") != "causal_lm", "only causal LM logits are cached"),
        (str(cfg.data.get("_target_", "")).endswith("ChatDataModule"), "chat data is not cached"),
        (
            (trainer.get("devices") or 1) != 1 or trainer.get("strategy") not in (None, "auto"),
            "several processes: write the cache first (python -m lightning_kd.cache "
            "strategy=ddp trainer.devices=N hydra.run.dir=DIR) and pass distill.teacher_cache=DIR",
        ),
    )
    return next((reason for applies, reason in reasons if applies), None)


def passes(cfg: DictConfig, train_examples: int) -> float:
    """How many times the run reads the teacher over its ``train_examples`` training blocks:
    its training passes and its block-wise repair's (:func:`repair_passes`)."""
    return training_passes(cfg, train_examples) + repair_passes(cfg, train_examples)


def training_passes(cfg: DictConfig, train_examples: int) -> float:
    trainer = cfg.trainer
    per_step = cfg.data.batch_size * (trainer.get("accumulate_grad_batches") or 1)
    if trainer.max_steps not in (None, -1):
        return trainer.max_steps * per_step / train_examples
    return float(trainer.get("max_epochs") or 1)


def repair_passes(cfg: DictConfig, train_examples: int) -> float:
    """``distill.blockwise_passes`` in passes over the blocks: a repair pass reads at most as many
    blocks as training does (``loaders.FullBatchShare``)."""
    repair = cfg.distill.get("blockwise_passes") or 0
    return repair * min(1.0, training_passes(cfg, train_examples))


def choose(cfg: DictConfig, train_examples: int) -> CacheChoice:
    """Cache or online, for a run of ``cfg`` over ``train_examples`` blocks (writes nothing)."""
    reason = why_online(cfg)
    if reason is not None:
        distill = instantiate(cfg.distill, _convert_="all")
        return CacheChoice(None, f"auto: {reason}", in_training=distill.uses_teacher_in_training)
    count, repair = passes(cfg, train_examples), repair_passes(cfg, train_examples)
    per = f"{count:.2f} passes over {train_examples} training blocks"
    per += f" ({repair:.2f} of them the block-wise repair's)" if repair else ""
    if count < MIN_PASSES:
        return CacheChoice(None, f"auto: {per}; a cache pays from {MIN_PASSES}")
    directory = str(Path(cfg.output_dir) / DIRECTORY)
    return CacheChoice(directory, f"auto: {per}, one teacher forward per block")


def resolve_teacher_cache(cfg: DictConfig, datamodule, tokenizer) -> CacheChoice | None:
    """Resolve ``distill.teacher_cache=auto`` in ``cfg`` itself, writing (or completing) the cache
    of ``datamodule`` (set up) when the run caches; None when the key was not ``auto``."""
    if not unresolved(cfg.distill.get("teacher_cache")):
        return None
    choice = choose(cfg, len(datamodule.train_examples))
    cfg.distill.teacher_cache = choice.path
    if rank_zero_only.rank == 0:
        print(choice.line(), flush=True)
    if choice.path is not None:
        write(cfg, datamodule, tokenizer, Path(choice.path))
    return choice


def write(cfg: DictConfig, datamodule, tokenizer, directory: Path) -> None:
    """The cache of ``cfg``'s teacher (loaded as training loads it) over ``datamodule``'s blocks,
    written with one process (the teacher is released when this returns)."""
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    spec = instantiate(cfg.cache, _convert_="all")
    teacher, features = cached_teacher(cfg, teacher_spec, spec)
    device = fabric_for(cfg).device
    teacher = teacher.to(device)
    stats = write_cache(
        teacher, tokenizer, datamodule, spec, directory, device=device, features=features
    )
    print(stats.line(0), flush=True)
    report(directory, spec, 0)
