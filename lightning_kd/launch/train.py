"""One distillation run from a composed config: resolve, build, fit, validate, export, report.

The library half of ``lightning-kd train`` (and ``python run.py``): the command-line half only
parses the overrides; a notebook calls :func:`train` with a config from ``compose_config``.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightning_kd.data.errors import DataError
from lightning_kd.launch.auto import resolve
from lightning_kd.launch.best_student import export_best
from lightning_kd.launch.build import build
from lightning_kd.launch.config import JobRecord, record_job
from lightning_kd.launch.gguf_export import export_gguf
from lightning_kd.launch.harness_run import evaluate_run
from lightning_kd.launch.inert_keys import inert_notes
from lightning_kd.launch.length_checks import early_stopping_note
from lightning_kd.launch.repair_states import drop_repair_states
from lightning_kd.launch.resume_settings import check_resume_settings
from lightning_kd.launch.stop_report import stop_report
from lightning_kd.launch.sweep_resume import unstarted_job
from lightning_kd.launch.teacher_cache import given_cache
from lightning_kd.launch.teacher_list import held_precisions
from lightning_kd.launch.train_checks import train_errors
from lightning_kd.launch.work_left import check_work_left, run_of
from lightning_kd.training.checkpoints import resolve_ckpt_path
from lightning_kd.training.finite import check_finite_model, check_finite_validation, strict_json
from lightning_kd.training.joining import joining
from lightning_kd.training.metrics import check_monitors_first, checked_monitors
from lightning_kd.training.peers import PeerLost, as_peer_lost
from lightning_kd.training.rundir import claim_run_dir, is_own_checkpoint, is_rank_zero
from lightning_kd.training.samples import samples_markdown
from lightning_kd.training.saving import agreed
from lightning_kd.training.stop_reason import stop_reason
from lightning_kd.training.summary import RunSummary, disk_use
from lightning_kd.utils.atomic import atomic_write_bytes, replaced_directory
from lightning_kd.utils.disk import disk_errors
from lightning_kd.utils.files import as_umask_allows
from lightning_kd.utils.refusal import Refused, refuse
from lightning_kd.utils.stopping import STOP, Interrupted, as_interrupted

COMMAND = ("lightning-kd", "train")
"""How a run from Python is named in its resume hint (the command line passes its own)."""
FINISH_AGAIN = "resume with ckpt_path=last, which finishes the run from its last checkpoint"
"""What follows a student or summary the disk had no room for (``utils/disk.py``)."""
KEPT_BEFORE_TRAINING = "the converted teacher and the teacher cache are kept and reused"
FINISHED_ON_RESUME = "resuming runs the final validation and the export"
FINISHING = "past its last step and validation, the run finishes its export and summary first"

# Warnings the installed Lightning raises about itself, with nothing in them for a user to act on.
LIGHTNING_NOISE = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # its pytree helper, on torch >= 2.10
    r"Precision bf16-mixed is not supported by the model summary",  # the size column is fp32
    # A resume mid-epoch: the loaders skip what was trained (data/loaders.py), unseen by it.
    r"You're resuming from a checkpoint that ended before the epoch ended",
    # Each validation example counts once: ranks are evened out with unscored copies.
    r"Using `DistributedSampler` with the dataloaders. During `trainer.validate\(\)`",
)


def not_a_tip(record: logging.LogRecord) -> bool:
    """Drops Lightning's advertisement for its cloud logger, which every trainer prints."""
    return not str(record.msg).startswith("💡 Tip:")


def train(
    cfg: DictConfig, ckpt_path: Path | None = None, command: Sequence[str] = COMMAND
) -> RunSummary:
    """Run one distillation as ``cfg`` describes, resuming from ``ckpt_path`` if given; returns
    (and writes) the summary. ``command`` is how the user launched it (the resume hint's
    prefix). A stop asked for by SIGINT/SIGTERM ends the run at the next clean point of its
    current stage with :class:`~lightning_kd.utils.stopping.Interrupted`."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.output_dir)
    resolved = resolve(cfg, ckpt_path)  # every `auto` setting, in one place
    STOP.check("before loading the models", detail=KEPT_BEFORE_TRAINING)
    cfg = resolved.cfg
    module, datamodule, trainer, timer = build(cfg, resolved.datamodule)
    if ckpt_path is not None:  # recorded once the resume's checkpoint is accepted
        trainer.callbacks.append(JobRecord(cfg, output_dir))
    try:
        # A resume's "before" figures come with its checkpoint: validating again repeats them.
        wanted = cfg.validate_before and ckpt_path is None
        with joining(trainer.strategy):  # the first stage starts the process group
            module.before = validate_before(trainer, module, datamodule, wanted)
            trainer.fit(module, datamodule, ckpt_path=ckpt_path)
        STOP.check("after training", agreed(trainer), FINISHED_ON_RESUME)  # all ranks' answer
        after = validate_after(trainer, module, datamodule)
        check_finite_validation(after, trainer.global_step)  # before the student is exported
        STOP.check("after the final validation", agreed(trainer), FINISHED_ON_RESUME)
        STOP.finishing = FINISHING
    except BaseException as err:
        stop = as_peer_lost(as_interrupted(err), trainer.global_rank, trainer.world_size)
        report_stop(stop, trainer, cfg, command)
        raise stop  # noqa: B904 (as_interrupted and as_peer_lost chained it)
    best = export_students(cfg, module, output_dir)
    if resolved.teacher_cache is not None and trainer.is_global_zero:
        training = {pair.teacher for pair in module.distiller.layer_pairs}
        keep = bool(cfg.cache.get("keep_repair_states"))
        resolved.teacher_cache = drop_repair_states(resolved.teacher_cache, training, keep)

    summary = summarise(module, trainer, resolved, module.before, after, timer)
    summary.best = best
    try:
        if trainer.is_global_zero:  # lm_eval.tasks: on the exported student, once
            summary.lm_eval = evaluate_run(cfg, output_dir / "student", trainer)
    finally:  # a task that fails still leaves the run's summary, then fails the command
        summary.wall_seconds = time.perf_counter() - start
        if trainer.is_global_zero:
            summary.written = disk_use(output_dir, summary.teacher_cache, summary.entry_caches)
            write_summary(summary, output_dir)
    return summary


def report_stop(err: BaseException, trainer: L.Trainer, cfg: DictConfig, command) -> None:
    """Print the stop report of a run that stopped in training (``launch/stop_report.py``). A
    failure before training started (a refused resume, a bad model) has no way on to print:
    the command that failed would only fail again; a process lost then has (start again). So
    has a refusal in training with no checkpoint (a teacher spelling back too little of a batch,
    probe 39), a bad row's aside (fixed, the data is edited)."""
    callback = trainer.checkpoint_callback
    started = getattr(callback, "started", False)
    refused = isinstance(err, Refused) and not isinstance(err, DataError)
    if refused and getattr(callback, "saved_step", None) is None:
        return
    # A lost process is told by every process left: on a node of its own, the only word there.
    telling = trainer.is_global_zero or isinstance(err, PeerLost)
    if telling and (isinstance(err, Interrupted | PeerLost) or started):  # a lost peer: anew
        lr = (cfg.get("optimizer") or {}).get("lr")  # a diverged run is given a tenth
        output_dir = Path(cfg.output_dir)
        print(stop_report(err, callback, output_dir, command, lr, trainer.global_rank), flush=True)


def summarise(module, trainer: L.Trainer, resolved, before: dict, after: dict, timer):
    """The run's :class:`RunSummary` (its wall time set by the caller)."""
    cuda = torch.cuda.is_available()
    cfg = resolved.cfg
    named = given_cache(cfg.distill.get("teacher_cache"), "distill.teacher_cache")
    cache = resolved.teacher_cache or named
    entries = {
        entry["name"]: choice
        for entry in cfg.get("teachers") or []
        if (choice := given_cache(entry.get("cache"), "the entry's cache")) is not None
    } | resolved.entry_caches
    stopped_by, stopped_early = stop_reason(trainer)
    return RunSummary(
        after=after,
        before=before,
        teacher_ppl=module.teacher_perplexity,
        steps=trainer.global_step,
        train_tokens=module.tokens_seen,
        train_seconds=timer.seconds,
        timed_tokens=module.tokens_seen - timer.tokens_at_start,
        peak_cuda_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        precision=resolved.precision.as_dict() | held_precisions(resolved.cfg, module.teachers),
        importance=resolved.ranking.as_dict() if resolved.ranking is not None else None,
        teacher_cache=cache.as_dict() | {"name": module.distiller.teacher_name} if cache else None,
        entry_caches={name: choice.as_dict() for name, choice in entries.items()},
        blockwise=module.blockwise.as_dict() if module.blockwise is not None else None,
        stopped_early=stopped_early,
        stopped_by=stopped_by,
    )


def export_students(cfg: DictConfig, module, output_dir: Path) -> dict | None:
    """The final student (with ``export.gguf``'s file), then ``checkpoint.best``'s beside it;
    the best one's record (None without ``checkpoint.best``, or ``export_student=false``)."""
    if not cfg.export_student:
        return None
    export_student(module, output_dir / "student")
    export_gguf(cfg, output_dir / "student", FINISH_AGAIN)
    return export_best(module, output_dir, export_student, cfg.checkpoint.get("best"))


def export_student(module, directory: Path) -> None:
    """The final student, checked finite, as a ``save_pretrained`` directory (a full disk named
    as one, with the way on)."""
    check_finite_model(module.student, "exporting the student")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(
            f"{directory} is a file, not the directory the student is exported to; move it "
            f"away and {FINISH_AGAIN}"
        )
    if rank_zero_only.rank != 0:  # module.export_student writes on rank 0 alone
        return
    # Whole or not at all: a half-written student/ (killed mid-export) was taken for a model.
    with disk_errors(directory, FINISH_AGAIN), replaced_directory(directory) as temp:
        module.export_student(str(temp))
        if not (temp / "config.json").is_file():
            raise RuntimeError(f"exporting the student wrote no config.json into {directory}")
        as_umask_allows(temp)  # transformers' 0600 weights: readable as any file written here


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


def run(cfg: DictConfig, command: Sequence[str] = COMMAND) -> float | None:
    """Check ``cfg``, claim its run directory and :func:`train` (resuming with ``ckpt_path``).
    SIGINT and SIGTERM stop every stage at its next clean point; the run then prints what it
    kept and the ``command`` that resumes (or restarts) it, and exits 130/143. Returns the final
    student perplexity (for sweeps), if it has one."""
    for message in LIGHTNING_NOISE:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(not_a_tip)  # once
    refuse(train_errors(cfg))
    for note in filter(None, [early_stopping_note(cfg), *inert_notes(cfg)]):
        warnings.warn(note, stacklevel=2)
    output_dir = Path(cfg.output_dir)
    if unstarted_job(cfg.ckpt_path, output_dir):  # a job a stopped -m sweep never reached
        cfg.ckpt_path = None
    ckpt_path = resolve_ckpt_path(cfg.ckpt_path, output_dir / "checkpoints")
    # Only a checkpoint of this directory's run resumes it: another run's, into a directory
    # holding a run, would replace that run's outputs (and splice the two runs' metrics).
    own = is_own_checkpoint(ckpt_path, output_dir)
    if (checked := run_of(ckpt_path, output_dir, own)) is not None:  # another's too (probe 52)
        check_work_left(ckpt_path, cfg.trainer, checked)
        check_resume_settings(ckpt_path, cfg)  # before a teacher cache is written for them
    resuming = own or (cfg.ckpt_path is not None and ckpt_path is None)  # or its repair.pt
    with STOP.installed(), claim_run_dir(output_dir, resuming=resuming, overwrite=cfg.overwrite):
        if is_rank_zero() and ckpt_path is None:  # a resume's: once its checkpoint is accepted
            record_job(cfg, output_dir)  # only now that the directory is this launch's
        try:
            return train(cfg, ckpt_path, command).after.get("val/ppl")
        except Interrupted as stop:
            if is_rank_zero() and not stop.reported:
                print(stop_report(stop, None, output_dir, command))
            sys.exit(stop.exit_code)
        except KeyboardInterrupt as stop:  # a second Ctrl+C: stopped at once
            if is_rank_zero() and not getattr(stop, "reported", False):
                print(stop_report(stop, None, output_dir, command), flush=True)
            sys.exit(128 + signal.SIGINT)


ONE_STAGE = (
    "FSDP wraps the model's blocks in place, and Lightning leaves the root unwrapped in a second "
    "stage on the same module (Lightning issue #19015): its parameters would be neither sharded "
    "nor reduced across ranks, so this run trains in one fit"
)


def validate_before(trainer: L.Trainer, module, datamodule, wanted: bool) -> dict[str, float]:
    """The untrained student's validation metrics, if ``wanted`` (none where only one stage can
    run). Without them, the callbacks' monitors are checked on one batch before training."""
    if wanted and wraps_in_place(trainer):
        print(f"validate_before skipped: {ONE_STAGE}")
        wanted = False
    if not wanted:
        check_monitors_first(trainer)
        return {}
    metrics = trainer.validate(module, datamodule, verbose=False)[0]
    return checked_monitors(trainer.callbacks, metrics)


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
