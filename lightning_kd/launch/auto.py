"""Every ``auto`` setting of a run resolved in one place, before anything is built:

- ``trainer.precision=auto`` and ``teacher.dtype=auto``: what this hardware computes fast
  (``models/precision.py``);
- ``student.layers=importance``: the teacher layers that matter most (``launch/importance.py``);
- ``distill.teacher_cache=auto``: the shared cache of the run's key, found or written now, or the
  teacher online (``launch/teacher_cache.py``).

:func:`resolve` returns a copy of the config with each of them concrete, and what each became and
why (the summary reports it); the config it is given is left as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from lightning_kd.data.epochs import Run, epoch_problems
from lightning_kd.data.errors import DataError
from lightning_kd.data.text import TextDataModule
from lightning_kd.distill.teacher_entries import teacher_keys
from lightning_kd.launch.build import build_datamodule, with_precision, with_values
from lightning_kd.launch.importance import choose_layers
from lightning_kd.launch.online_reasons import unresolved, why_online
from lightning_kd.launch.resumed_cache import MAIN, as_trained, checkpoint_records
from lightning_kd.launch.teacher_cache import CacheChoice, choose, prepare
from lightning_kd.models.layer_scores import Ranking
from lightning_kd.models.precision import PrecisionChoice
from lightning_kd.models.student import run_tokenizer


@dataclass
class Resolved:
    """A run's config with its ``auto`` settings concrete, and what they became."""

    cfg: DictConfig
    precision: PrecisionChoice
    ranking: Ranking | None = None
    """``student.layers=importance``: the scores behind the layers kept (None on a resume
    without this run directory's ``importance.json``, or when layers were not ``importance``)."""
    teacher_cache: CacheChoice | None = None
    """``distill.teacher_cache=auto``: cached or online, and why (None: it was not ``auto``)."""
    datamodule: TextDataModule | None = None
    """The data module the cache was matched to, set up (the run trains on it), or None."""
    entry_caches: dict[str, CacheChoice] = field(default_factory=dict)
    """``teachers`` entries with ``cache: auto``: each one's choice, by name."""


def resolve(cfg: DictConfig, ckpt_path: Path | None = None) -> Resolved:
    """Resolve every ``auto`` setting of ``cfg`` (a resume from ``ckpt_path`` keeps the layers
    its student was built from); the teacher cache is found or written here."""
    cfg, precision = with_precision(cfg, training=True)
    resolved = Resolved(cfg, precision)
    if (chosen := choose_layers(cfg, ckpt_path)) is not None:
        layers, resolved.ranking = chosen
        resolved.cfg = with_values(resolved.cfg, {"student.layers": layers})
    teachers = resolved.cfg.get("teachers") or []
    entries_auto = any(unresolved(entry.get("cache")) for entry in teachers)
    main_auto = unresolved(resolved.cfg.distill.get("teacher_cache"))
    # A resume's teachers reach the loss as they did (its checkpoint read only for an auto).
    trained = checkpoint_records(ckpt_path) if main_auto or entries_auto else {}
    if main_auto:
        choice, datamodule = resolve_teacher_cache(resolved.cfg, ckpt_path is not None, trained)
        resolved.teacher_cache, resolved.datamodule = choice, datamodule
        resolved.cfg = with_values(resolved.cfg, {"distill.teacher_cache": choice.path})
    if entries_auto:
        resolving = EntryCaches(resolved.cfg, resolved.datamodule, ckpt_path is not None, trained)
        resolved.cfg, resolved.datamodule = resolving.all()
        resolved.entry_caches = resolving.choices
    return resolved


def resolve_teacher_cache(
    cfg: DictConfig, resuming: bool = False, trained: dict[str, str] | None = None
) -> tuple[CacheChoice, TextDataModule]:
    """Cache or online for ``cfg`` (whose other settings are concrete), the cache prepared (a
    resume's without the repair's states; as its checkpoint ``trained``: online or cached),
    and the set-up data module it was matched to."""
    teacher = instantiate(cfg.teacher, _convert_="all")
    tokenizer = run_tokenizer(teacher, instantiate(cfg.student, _convert_="all"))
    datamodule = build_datamodule(cfg, tokenizer)
    datamodule.setup("fit")
    blocks = len(datamodule.train_examples)
    trainer = cfg.trainer  # one process assumed: the trainer's setup checks each rank's share
    run = Run(
        trainer.accumulate_grad_batches, trainer.get("limit_train_batches"), trainer.max_steps
    )
    # Before a cache is written for a run that cannot start (the block-wise repair's batch too:
    # its sampler checks again with every rank's share). A stream has no blocks here: 0.
    if blocks and (error := epoch_problems(blocks, datamodule.batch_size, run)[0]):
        raise DataError(error)
    choice = choose(cfg, blocks, len(datamodule.val_examples or ()))
    choice = as_trained(choice, (trained or {}).get(MAIN), why_online(cfg) is None)
    if choice.caches:
        choice = prepare(cfg, datamodule, tokenizer, choice, resuming)
    if rank_zero_only.rank == 0:
        print(choice.line(), flush=True)
    return choice, datamodule


@dataclass
class EntryCaches:
    """``teachers`` entries with ``cache: auto``, each resolved as ``distill.teacher_cache=auto``
    is for its own model, one teacher at a time (each released before the next loads)."""

    cfg: DictConfig
    datamodule: TextDataModule | None
    resuming: bool
    trained: dict[str, str] = field(default_factory=dict)
    """How a resumed checkpoint's teachers reached the loss, by name (kept)."""
    choices: dict[str, CacheChoice] = field(default_factory=dict)
    """Each resolved entry's choice, by name (the summary reports them)."""

    def all(self) -> tuple[DictConfig, TextDataModule]:
        """The config with each such entry's ``cache`` a directory or null, and the set-up data
        module the caches were matched to."""
        if self.datamodule is None:
            teacher = instantiate(self.cfg.teacher, _convert_="all")
            tokenizer = run_tokenizer(teacher, instantiate(self.cfg.student, _convert_="all"))
            self.datamodule = build_datamodule(self.cfg, tokenizer)
            self.datamodule.setup("fit")
        # The main teacher's cache resolution has set the data up with the run's tokenizer.
        tokenizer = self.datamodule.tokenizer
        cfg = self.cfg
        for index, entry in enumerate(self.cfg.teachers):
            if unresolved(entry.get("cache")):
                choice = self.resolve(OmegaConf.to_container(entry), tokenizer)
                cfg = with_values(cfg, {f"teachers.{index}.cache": choice.path})
                self.choices[str(entry.name)] = choice
        return cfg, self.datamodule

    def resolve(self, entry: dict, tokenizer) -> CacheChoice:
        """Cache or online for ``entry``'s teacher: the run's config with that teacher in the
        teacher group's place, logits only (a second teacher's hidden states are not read)."""
        keys = {f"teacher.{key}": value for key, value in teacher_keys(entry).items()}
        logits_only = {"distill.features": None, "distill.blockwise_passes": 0}
        cfg = with_values(self.cfg, keys | logits_only | {"cache.features": False})
        data = self.datamodule
        shares = domain_shares(entry.get("domains"), data)
        choice = choose(cfg, len(data.train_examples), len(data.val_examples or ()), shares)
        choice = as_trained(choice, self.trained.get(entry["name"]), why_online(cfg) is None)
        if choice.caches:
            choice = prepare(cfg, self.datamodule, tokenizer, choice, self.resuming)
        if rank_zero_only.rank == 0:
            print(
                f"teachers[{entry['name']}]: {choice.line().removeprefix('teacher: ')}", flush=True
            )
        return choice


def domain_shares(domains: list[str] | None, data: TextDataModule) -> tuple[float, float]:
    """The shares of the training and validation blocks of ``data`` whose domain is one of
    ``domains`` (a ``teachers`` entry's): what the teacher reads of each split."""
    if domains is None or data.domains is None:
        return 1.0, 1.0
    taught = data.domains.indices(domains, "teachers")
    split = (data.train_domains or [], data.val_domains or [])
    return tuple(sum(d in taught for d in part) / max(1, len(part)) for part in split)
