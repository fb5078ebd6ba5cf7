"""Launch a distillation: compose the config, build the pieces, fit, report, export.

python run.py                                   # SmolLM2-135M → 6-layer student, default corpus
python run.py debug=smoke                       # tiny models, seconds
python run.py distill.divergence=jsd data.files=[my.jsonl] hydra.run.dir=runs/a
"""

from __future__ import annotations

import json
import signal
import sys
import time
import warnings
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from lightning_kd.cache.auto import CacheChoice, resolve_teacher_cache, unresolved
from lightning_kd.checkpoints import resolve_ckpt_path
from lightning_kd.checks import check_config
from lightning_kd.config import register_defaults
from lightning_kd.data import TextDataModule
from lightning_kd.finite import check_finite_model, strict_json
from lightning_kd.importance import choose_layers
from lightning_kd.launch import build, build_datamodule, resolve_auto_precision
from lightning_kd.models import load_tokenizer
from lightning_kd.rundir import claim_run_dir, resume_command
from lightning_kd.samples import samples_markdown
from lightning_kd.saving import RunInterrupted, stop_report
from lightning_kd.summary import RunSummary

# Warnings the installed Lightning raises about itself, with nothing in them for a user to act on.
LIGHTNING_NOISE = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # its pytree helper, on torch >= 2.10
    r"Precision bf16-mixed is not supported by the model summary",  # the size column is fp32
)


def distill(cfg: DictConfig, ckpt_path: Path | None = None) -> RunSummary:
    """Run one distillation as ``cfg`` describes, resuming from ``ckpt_path`` if given; returns
    (and writes) the summary."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.output_dir)
    precision = resolve_auto_precision(cfg)
    ranking = choose_layers(cfg, ckpt_path)  # student.layers=importance → indices, before build
    caching, prepared = cache_teacher(cfg)  # distill.teacher_cache=auto → a path or online
    module, datamodule, trainer, timer = build(cfg, prepared)

    before = validate_before(trainer, module, datamodule) if cfg.validate_before else {}
    try:
        trainer.fit(module, datamodule, ckpt_path=ckpt_path)
    except BaseException as err:
        if trainer.is_global_zero:
            print(stop_report(err, trainer.checkpoint_callback, resume_hint(output_dir)))
        raise
    after = validate_after(trainer, module, datamodule)
    if cfg.export_student:
        check_finite_model(module.student, "exporting the student")
        module.export_student(str(output_dir / "student"))

    summary = RunSummary(
        after=after,
        before=before,
        teacher_ppl=module.teacher_perplexity,
        steps=trainer.global_step,
        train_tokens=module.tokens_seen,
        train_seconds=timer.seconds,
        wall_seconds=time.perf_counter() - start,
        peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20
        if torch.cuda.is_available()
        else None,
        precision=precision.as_dict() | quantized(cfg),
        importance=ranking.as_dict() if ranking is not None else None,
        teacher_cache=caching.as_dict() if caching is not None else None,
        blockwise=module.blockwise.as_dict() if module.blockwise is not None else None,
    )
    if trainer.is_global_zero:
        strict = json.dumps(strict_json(summary.as_dict()), indent=2, allow_nan=False)
        (output_dir / "summary.json").write_text(strict)
        samples = samples_markdown(output_dir)  # +callbacks=samples: the last completions
        extra = f"\n{samples}\n" if samples else ""
        (output_dir / "summary.md").write_text(summary.markdown() + "\n" + extra)
        print("\n" + summary.markdown())
        print(f"\nrun directory: {output_dir}")
    return summary


register_defaults()  # the groups' defaults come from the dataclasses (lightning_kd.config)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Hydra entry point; returns the final student perplexity (for sweeps), if it has one."""
    for message in LIGHTNING_NOISE:
        warnings.filterwarnings("ignore", message=message)
    check_config(cfg)  # before anything loads
    output_dir = Path(cfg.output_dir)
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, output_dir / "checkpoints")
    with claim_run_dir(output_dir, resuming=ckpt_path is not None, overwrite=cfg.overwrite):
        try:
            return distill(cfg, ckpt_path).after.get("val/ppl")
        except RunInterrupted as stop:
            sys.exit(stop.exit_code)
        except SIGTERMException:  # Lightning's own SIGTERM stop (outside training) exits 0
            sys.exit(128 + signal.SIGTERM)


ONE_STAGE = (
    "FSDP wraps the model's blocks in place, and Lightning leaves the root unwrapped in a second "
    "stage on the same module (Lightning issue #19015): its parameters would be neither sharded "
    "nor reduced across ranks, so this run trains in one fit"
)


def cache_teacher(cfg: DictConfig) -> tuple[CacheChoice | None, TextDataModule | None]:
    """With ``distill.teacher_cache=auto``: the choice (the cache written into the run directory
    when it pays) and the data module it was made for (set up; the run trains on it)."""
    if not unresolved(cfg.distill.get("teacher_cache")):
        return None, None
    tokenizer = load_tokenizer(instantiate(cfg.teacher, _convert_="all"))
    datamodule = build_datamodule(cfg, tokenizer)
    datamodule.setup("fit")
    return resolve_teacher_cache(cfg, datamodule, tokenizer), datamodule


def validate_before(trainer: L.Trainer, module, datamodule) -> dict[str, float]:
    """The untrained student's validation metrics (none where only one stage can run)."""
    if wraps_in_place(trainer):
        print(f"validate_before skipped: {ONE_STAGE}")
        return {}
    return trainer.validate(module, datamodule, verbose=False)[0]


def validate_after(trainer: L.Trainer, module, datamodule) -> dict[str, float]:
    """The final student's validation metrics. A validation at the last step (val_check_interval
    dividing max_steps) already measured it: reused rather than run the teacher once more."""
    after = module.validation_at(trainer.global_step)
    if after is not None:
        return after
    if wraps_in_place(trainer):
        print(
            f"final validation skipped: {ONE_STAGE}; a trainer.val_check_interval dividing "
            "trainer.max_steps validates the final student inside fit"
        )
        return {}
    return trainer.validate(module, datamodule, verbose=False)[0]


def wraps_in_place(trainer: L.Trainer) -> bool:
    """Whether ``trainer``'s strategy wraps the module's own submodules (FSDP), so that only one
    stage (``fit``) can run on the module."""
    return isinstance(trainer.strategy, FSDPStrategy)


def quantized(cfg: DictConfig) -> dict[str, str]:
    """``{"quantize": "int8"}`` for the summary when the teacher is quantized, else nothing."""
    mode = cfg.teacher.get("quantize")
    return {"quantize": mode} if mode else {}


def resume_hint(output_dir: Path) -> str:
    """The command that resumes this run (its task overrides, its directory, ckpt_path=last)."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return resume_command(Path(sys.argv[0]).name, overrides, output_dir)


if __name__ == "__main__":
    main()
