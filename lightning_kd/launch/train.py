"""One distillation run from a composed config: resolve, build, fit, validate, export, report.

The library half of ``lightning-kd train`` (and ``python run.py``): the command-line half only
parses the overrides; a notebook calls :func:`train` with a config from ``compose_config``.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from lightning_kd.launch.auto import resolve
from lightning_kd.launch.build import build
from lightning_kd.launch.entry import check_entry
from lightning_kd.launch.teacher_cache import drop_repair_states
from lightning_kd.training.checkpoints import resolve_ckpt_path
from lightning_kd.training.finite import check_finite_model, strict_json
from lightning_kd.training.rundir import claim_run_dir, resume_command
from lightning_kd.training.samples import samples_markdown
from lightning_kd.training.saving import RunInterrupted, stop_report
from lightning_kd.training.summary import RunSummary, disk_use
from lightning_kd.utils.atomic import atomic_write_bytes
from lightning_kd.utils.disk import disk_errors

FINISH_AGAIN = "resume with ckpt_path=last, which finishes the run from its last checkpoint"
"""What follows a student or summary the disk had no room for (``utils/disk.py``)."""

# Warnings the installed Lightning raises about itself, with nothing in them for a user to act on.
LIGHTNING_NOISE = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # its pytree helper, on torch >= 2.10
    r"Precision bf16-mixed is not supported by the model summary",  # the size column is fp32
)


def train(
    cfg: DictConfig, ckpt_path: Path | None = None, command: Sequence[str] = ("python", "run.py")
) -> RunSummary:
    """Run one distillation as ``cfg`` describes, resuming from ``ckpt_path`` if given; returns
    (and writes) the summary. ``command`` is how the user launched it (the resume hint's
    prefix)."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.output_dir)
    resolved = resolve(cfg, ckpt_path)  # every `auto` setting, in one place
    cfg = resolved.cfg
    module, datamodule, trainer, timer = build(cfg, resolved.datamodule)

    before = validate_before(trainer, module, datamodule) if cfg.validate_before else {}
    try:
        trainer.fit(module, datamodule, ckpt_path=ckpt_path)
    except BaseException as err:
        if trainer.is_global_zero:
            hint = resume_hint(output_dir, command)
            print(stop_report(err, trainer.checkpoint_callback, hint))
        raise
    after = validate_after(trainer, module, datamodule)
    if cfg.export_student:
        export_student(module, output_dir / "student")
    if resolved.teacher_cache is not None and trainer.is_global_zero:
        training = {pair.teacher for pair in module.distiller.layer_pairs}
        keep = bool(cfg.cache.get("keep_repair_states"))
        resolved.teacher_cache = drop_repair_states(resolved.teacher_cache, training, keep)

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
        precision=resolved.precision.as_dict() | quantized(cfg),
        importance=resolved.ranking.as_dict() if resolved.ranking is not None else None,
        teacher_cache=resolved.teacher_cache.as_dict() if resolved.teacher_cache else None,
        blockwise=module.blockwise.as_dict() if module.blockwise is not None else None,
    )
    if trainer.is_global_zero:
        summary.written = disk_use(output_dir, summary.teacher_cache)
        write_summary(summary, output_dir)
    return summary


def export_student(module, directory: Path) -> None:
    """The final student, checked finite, as a ``save_pretrained`` directory (a full disk named
    as one, with the way on)."""
    check_finite_model(module.student, "exporting the student")
    with disk_errors(directory, FINISH_AGAIN):
        module.export_student(str(directory))


def write_summary(summary: RunSummary, output_dir: Path) -> None:
    """``summary.json`` (strict JSON) and ``summary.md`` (with the last samples, if any) in
    ``output_dir``; the table printed."""
    strict = json.dumps(strict_json(summary.as_dict()), indent=2, allow_nan=False)
    samples = samples_markdown(output_dir)  # +callbacks=samples: the last completions
    extra = f"\n{samples}\n" if samples else ""
    for name, text in (("summary.json", strict), ("summary.md", summary.markdown() + "\n" + extra)):
        atomic_write_bytes(output_dir / name, text.encode(), FINISH_AGAIN)
    print("\n" + summary.markdown())
    print(f"\nrun directory: {output_dir}")


def run(cfg: DictConfig, command: Sequence[str] = ("python", "run.py")) -> float | None:
    """Check ``cfg``, claim its run directory and :func:`train` (resuming with ``ckpt_path``);
    an interrupted run exits 130/143 after printing the ``command`` that resumes it. Returns the
    final student perplexity (for sweeps), if it has one."""
    for message in LIGHTNING_NOISE:
        warnings.filterwarnings("ignore", message=message)
    check_entry(cfg)  # before anything loads (the positions: preflight.py, once built)
    output_dir = Path(cfg.output_dir)
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, output_dir / "checkpoints")
    with claim_run_dir(output_dir, resuming=ckpt_path is not None, overwrite=cfg.overwrite):
        try:
            return train(cfg, ckpt_path, command).after.get("val/ppl")
        except RunInterrupted as stop:
            sys.exit(stop.exit_code)
        except SIGTERMException:  # Lightning's own SIGTERM stop (outside training) exits 0
            sys.exit(128 + signal.SIGTERM)


ONE_STAGE = (
    "FSDP wraps the model's blocks in place, and Lightning leaves the root unwrapped in a second "
    "stage on the same module (Lightning issue #19015): its parameters would be neither sharded "
    "nor reduced across ranks, so this run trains in one fit"
)


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


def resume_hint(output_dir: Path, command: Sequence[str]) -> str:
    """The command that resumes this run (its task overrides, its directory, ckpt_path=last)."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    return resume_command(command, overrides, output_dir)
