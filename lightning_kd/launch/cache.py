"""Write the teacher cache: the library half of ``lightning-kd cache hydra.run.dir=DIR``.

What the command cannot write is refused before the directory is claimed; the directory is
claimed (one writer, no reader while it replaces a cache) before any rank starts; the teacher
is loaded as a training run of the config loads it, so that the cache's key is that run's; and
the ranks Lightning Fabric launches write their own shards.
"""

from __future__ import annotations

import json
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from hydra.utils import instantiate
from lightning.fabric import Fabric
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from lightning_kd.cache.claim import claim
from lightning_kd.cache.format import INDEX_NAME, CacheSpec
from lightning_kd.cache.hidden_states import mapped_paths
from lightning_kd.cache.narrow import narrow_cache
from lightning_kd.cache.writer import write_cache
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.spelled_share import judge_first_blocks
from lightning_kd.distill.tokenizer_pairs import teacher_tokenizer_for
from lightning_kd.launch.build import build_datamodule, with_precision
from lightning_kd.launch.cache_k_checks import cache_k_errors
from lightning_kd.launch.config import record_job
from lightning_kd.launch.data_checks import dataset_errors, is_chat_data
from lightning_kd.launch.entry import check_entry, teacher_length
from lightning_kd.launch.paths import training_run_errors
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.models.student import run_tokenizer
from lightning_kd.training.joining import joining
from lightning_kd.training.peers import lost_told
from lightning_kd.training.rundir import is_rank_zero
from lightning_kd.training.same_config import flat_settings, same_config_error
from lightning_kd.utils.refusal import Refused, refuse


def fabric_for(cfg: DictConfig) -> Fabric:
    """One process per device: ``strategy=`` set (any) means DDP over ``trainer.devices``."""
    strategy = cfg.trainer.get("strategy")
    ddp = strategy not in (None, "auto")
    return Fabric(
        accelerator=cfg.trainer.get("accelerator") or "auto",
        devices=cfg.trainer.get("devices") or 1,
        strategy="ddp" if ddp else "auto",
    )


def launched(cfg: DictConfig) -> Fabric:
    """:func:`fabric_for` ``cfg``, its processes started and joined."""
    fabric = fabric_for(cfg)
    with joining(fabric.strategy, "the cache command"):
        fabric.launch()
    return fabric


def cached_teacher(
    cfg: DictConfig, teacher_spec, spec, repairs: bool = True
) -> tuple[torch.nn.Module, list[str], list[str]]:
    """The teacher as a training run of ``cfg`` loads it (``teacher.quantize`` applied, so the
    weights digest is that run's); the module paths whose outputs ``cache.features`` stores:
    those ``distill.features`` maps and, where the run ``repairs`` (not on a resume) against
    this teacher (not ``student.source``), those the block-wise repair reads; and of those, the
    ones ``distill.features`` maps alone."""
    teacher = load_teacher(teacher_spec, cfg.trainer.precision)
    distill = instantiate(cfg.distill, _convert_="all")
    # A student copied from student.source is repaired against that model, not this teacher:
    # its spans are the source's layers (a Gemma teacher was asked for SmolLM2's layer 22).
    if not repairs or cfg.student.get("source") is not None:
        distill = replace(distill, blockwise_passes=0)
    stores = (
        spec.features
        if spec.features is not None
        else bool(distill.features or distill.blockwise_passes)
    )
    features, training = [], []
    if stores:  # resolved on the full-precision teacher, as the distiller resolves them
        student = instantiate(cfg.student, _convert_="all")
        features, training = mapped_paths(distill, student, teacher, teacher_spec.task)
    if teacher_spec.quantize is not None:
        quantize_teacher(teacher, teacher_spec.quantize)
    return teacher, features, training


def write(cfg: DictConfig) -> None:
    """Write the cache of ``cfg`` into ``cfg.output_dir``, holding the directory's writer lock
    from before any rank starts (a DDP launch re-runs this per rank: only the launching process
    takes it, as rank 0 of one writer)."""
    directory = Path(cfg.output_dir)
    # Before the claim and record_job: a training run's directory keeps its own record.
    refuse(training_run_errors(directory, "cache"))
    check_cache_entry(cfg)  # before the claim: a refused cache leaves no lock, no record
    with claim(directory, cfg.overwrite) if is_rank_zero() else nullcontext():
        if is_rank_zero():
            record_job(cfg, directory)  # once the directory is this writer's
        write_claimed(cfg, directory)


def cross_path(
    cfg: DictConfig, teacher: TeacherSpec, tokenizer: PreTrainedTokenizerBase
) -> CrossPath | None:
    """How the teacher reads the student's blocks when its tokenizer is not ``tokenizer`` (the
    student's): its cache then holds its top k at the student's positions aligned with its own;
    what a cross-tokenizer run of ``cfg`` cannot serve is refused here. None: one tokenizer."""
    distill = instantiate(cfg.distill, _convert_="all")
    student = instantiate(cfg.student, _convert_="all")
    teacher_tokenizer = teacher_tokenizer_for(teacher, distill, tokenizer, student)
    return None if teacher_tokenizer is None else CrossPath(distill, teacher_tokenizer)


@dataclass
class CrossPath:
    """A cross-tokenizer teacher's settings and tokenizer, before its model loads."""

    distill: DistillConfig
    teacher_tokenizer: PreTrainedTokenizerBase

    def build(self, tokenizer: PreTrainedTokenizerBase, teacher: torch.nn.Module) -> CrossTokenizer:
        teacher_vocab = teacher.get_output_embeddings().weight.shape[0]
        args = (tokenizer, self.teacher_tokenizer, len(tokenizer), teacher_vocab)
        return CrossTokenizer(
            *args,
            top_k=self.distill.cross_top_k,
            loss=self.distill.cross_loss,
            min_aligned=self.distill.cross_min_aligned,
        )


TEACHERS_LIST = [
    "teachers is set, and lightning-kd cache writes one teacher's cache, the teacher group's; "
    "add teachers=null to write that one (a run reads it as distill.teacher_cache=DIR). Write an "
    "entry's own with the entry's model as the teacher and the run's student tokenizer as "
    "student.source, logits only (lightning-kd cache teacher.path=<the entry's path> "
    "student.source=<the teacher group's path> distill.features=null hydra.run.dir=DIR; a run "
    "reads it as teachers.N.cache=DIR), or let "
    "the run decide (teachers.N.cache=auto: written where a cache pays, else online)"
]
"""Why a ``teachers`` list is refused: cached here, all but one of its teachers went unwritten."""


def check_cache_entry(cfg: DictConfig) -> None:
    """Refuse, before anything is claimed or loaded, what ``cache`` cannot write."""
    lengths = [teacher_length(cfg, "data.block_size")]
    streamed = [
        "data.streaming=true: a stream has no fixed blocks to cache; set data.streaming=false"
    ]
    extra = dataset_errors(cfg)
    extra += streamed if cfg.data.get("streaming") else []
    extra += TEACHERS_LIST if cfg.get("teachers") else []
    if is_chat_data(cfg.data):  # found by the writer once the teacher had loaded: a traceback
        extra.append(
            "data=chat: a teacher cache holds plain text blocks; train on chat data with the "
            "teacher online (distill.teacher_cache=null)"
        )
    if (task := cfg.teacher.get("task", "causal_lm")) != "causal_lm":
        extra.append(
            f"teacher.task={task}: only a causal LM's logits are cached; train with the "
            "teacher online (distill.teacher_cache=null)"
        )
    check_entry(cfg, lengths=lengths, extra=extra + cache_k_errors(cfg, "cache"))


def write_claimed(cfg: DictConfig, directory: Path) -> None:
    """Build the data and the teacher of ``cfg`` and write the cache into ``directory``."""
    cfg, _ = with_precision(cfg)
    teacher_spec = instantiate(cfg.teacher, _convert_="all")
    tokenizer = run_tokenizer(teacher_spec, instantiate(cfg.student, _convert_="all"))
    crossing = cross_path(cfg, teacher_spec, tokenizer)
    spec = instantiate(cfg.cache, _convert_="all")
    fabric = launched(cfg)
    if error := same_config_error(flat_settings(cfg), fabric.world_size, "the cache command"):
        raise Refused(error)
    with lost_told(fabric.global_rank, fabric.world_size, "the cache command", INCOMPLETE):
        write_launched(cfg, fabric, teacher_spec, tokenizer, crossing, spec, directory)


INCOMPLETE = (
    f"the cache is incomplete (no {INDEX_NAME} yet: no run reads it); the same command keeps "
    "its whole shards and writes the rest"
)


def write_launched(
    cfg: DictConfig,
    fabric: Fabric,
    teacher_spec: TeacherSpec,
    tokenizer: PreTrainedTokenizerBase,
    crossing: CrossPath | None,
    spec: CacheSpec,
    directory: Path,
) -> None:
    """Write the cache of ``cfg`` into ``directory`` from each of ``fabric``'s processes."""
    datamodule = build_datamodule(cfg, tokenizer)
    datamodule.setup("fit")
    teacher, features, _ = cached_teacher(cfg, teacher_spec, spec)
    teacher = teacher.to(fabric.device)
    cross = None if crossing is None else crossing.build(tokenizer, teacher)
    if cross is not None:  # on every rank alike, before any shard is written
        judge_first_blocks(cross, datamodule)
    if spec.source is not None:  # no teacher forward: one process derives it
        if fabric.global_rank == 0:
            arguments = (spec.source, teacher, tokenizer, datamodule, spec, directory)
            count = narrow_cache(
                *arguments, overwrite=cfg.overwrite, features=tuple(features), cross=cross
            )
            print(f"teacher cache: {count} shards narrowed from {spec.source}", flush=True)
        fabric.barrier()
    else:
        stats = write_cache(
            teacher,
            tokenizer,
            datamodule,
            spec,
            directory,
            rank=fabric.global_rank,
            world_size=fabric.world_size,
            barrier=fabric.barrier,
            device=fabric.device,
            overwrite=cfg.overwrite,
            features=features,
            cross=cross,
        )
        print(stats.line(fabric.global_rank), flush=True)
    report(directory, spec, fabric.global_rank)


def report(directory: Path, spec, rank: int) -> None:
    """One line on the cache written: size, bytes per position and entry, mass kept."""
    if rank == 0:
        summary = json.loads((directory / INDEX_NAME).read_text())["stats"]
        print(
            f"teacher cache: {directory} ({summary['bytes'] / 2**20:.1f} MiB, "
            f"{summary['scored_positions']} scored positions, "
            f"{summary['bytes_per_scored_position']:.1f} bytes each, "
            f"{summary['bytes_per_entry']:.2f} per top-k entry; the top {spec.k} hold "
            f"{summary['mean_top_k_mass']:.4f} of the mass on average)",
            flush=True,
        )
        if summary["mean_top_k_mass"] < LOW_MASS:
            warnings.warn(LOW_MASS_TEXT.format(spec.k, summary["mean_top_k_mass"]), stacklevel=2)


LOW_MASS = 0.5
"""The mean mass of the top k under which a cache is said to hold too little of the teacher."""
LOW_MASS_TEXT = (
    "teacher cache: the top {} hold {:.2f} of the teacher's mass on average; a run trained from "
    "it sees the rest as one outcome, in its KD term and in its KL (a lower bound of the full "
    "one); raise cache.k, or train online"
)
