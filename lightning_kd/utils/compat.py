"""Every use of Lightning's private API, in one place.

Lightning offers no public way to do these eleven things, and each is private API that can change
in any release. ``tests/unit/utils/test_compat.py`` checks each one against the installed
Lightning and fails naming what moved; fix it here, and nothing else needs to change.

- :class:`FSDPStrategyWithWrapHook`: a hook just before FSDP wraps the LightningModule
  (``FSDPStrategy._setup_model``), when the models exist (``configure_model`` has run).
- :func:`resumed_batches_in_epoch`: the batches of the current epoch a resumed fit has trained
  on (``fit_loop.restarting``, ``fit_loop.epoch_loop.batch_progress``).
- :func:`saved_batches_in_epoch`: a checkpoint's count of its epoch's batches, and whether the
  last was its epoch's last (``loops.fit_loop["epoch_loop.batch_progress"]``).
- :func:`reopen_cut_epoch`: have a checkpoint saved as ``fit`` ends inside an epoch (at
  ``trainer.max_steps`` or ``max_time``) resume inside it (``fit_loop["epoch_progress"]``).
- :func:`move_resumed_batches`: have a resumed fit count another number of its epoch's batches
  done, and of the run's, before its epoch loop resets (``batch_progress``, ``current`` and
  ``total``; ``fit_loop.epoch_progress``).
- :func:`validates_after_this_batch`: whether the fit loop validates right after the training
  batch that just ended (``epoch_loop._should_check_val_fx``, ``_skip_next_val``).
- :func:`validate_every_steps`: validations every N optimizer steps, counted as steps (a subclass
  of ``_TrainingEpochLoop`` whose ``_should_check_val_fx`` reads ``global_step``), in the fit
  loop's ``epoch_loop`` where Lightning's ``Trainer`` puts its own.
- :func:`silence_eval_mode_warning`: drop the start-of-training warning about modules in eval
  mode when it counts exactly the frozen teacher's (``_FitLoop._warn_if_modules_in_eval_mode``).
- :func:`attached_trainer`: the trainer a LightningModule is attached to, or None
  (``LightningModule._trainer``: the public ``trainer`` property raises where there is none).
- :func:`exclude_from_ddp`: keep named parameters and buffers out of DDP's broadcast from rank 0
  and out of its reducer (``_ddp_params_and_buffers_to_ignore``, read by torch's DDP and by
  Lightning's own ``_sync_module_states`` outside ``fit``).
- :func:`signal_started_processes`: hand a signal to the ranks a DDP launch started (``kill`` of
  Lightning's ``_SubprocessScriptLauncher``, ``procs`` of Fabric's).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch import nn

EVAL_MODE_CHECK = "_warn_if_modules_in_eval_mode"
"""The fit loop's method that warns, once per ``fit``, about modules in eval mode."""

EVAL_MODE_WARNING = "Found {count} module(s) in eval mode at the start of training"
"""The start of that warning's text (a ``PossibleUserWarning``)."""


class FSDPStrategyWithWrapHook(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` with a public hook, :meth:`before_wrap`, run on the
    LightningModule just before FSDP wraps it."""

    def before_wrap(self, model: nn.Module) -> None:
        """Override: the models exist now, and ``self.kwargs`` still reaches FSDP."""

    def _setup_model(self, model: nn.Module) -> nn.Module:
        # Private: the one place FSDPStrategy builds FSDP from ``self.kwargs``, after
        # ``configure_model`` (the strategy is built before the models exist).
        self.before_wrap(model)
        return super()._setup_model(model)


class StepIntervalLoop(_TrainingEpochLoop):
    """Lightning's training epoch loop, validating after every ``steps``-th optimizer step.

    Lightning counts an interval in batches across epochs (``val_check_interval`` ×
    accumulation): an epoch ending in a partial accumulation window shifts every later count, and
    validations fell inside windows (steps 15, 20, 26 of a run asked for every 5; probe 47),
    where no checkpoint can be taken and early stopping reads another grid.
    """

    def __init__(self, trainer: Trainer, min_steps: int | None, max_steps: int, steps: int):
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.steps = steps

    def _should_check_val_fx(self, data_fetcher) -> bool:
        if not self._should_check_val_epoch():
            return False
        if self.trainer.should_stop and self.trainer.fit_loop._can_stop_early:
            return True  # Lightning's own: a stop (early stopping) validates where it stands
        # After the batch that ended a window (an optimizer step), never inside one.
        return not self._should_accumulate() and self.trainer.global_step % self.steps == 0


def validate_every_steps(trainer: Trainer, steps: int) -> None:
    """Have ``trainer`` (not fitting yet) validate after every ``steps``-th optimizer step."""
    loop = trainer.fit_loop.epoch_loop
    trainer.fit_loop.epoch_loop = StepIntervalLoop(trainer, loop.min_steps, loop.max_steps, steps)


def resumed_batches_in_epoch(trainer: Trainer) -> int:
    """Training batches of the current epoch that a fit resumed from a checkpoint has already
    processed (restored from the checkpoint's loop state); 0 unless the fit loop is restarting."""
    loop = trainer.fit_loop
    if not loop.restarting:
        return 0
    return loop.epoch_loop.batch_progress.current.processed


def saved_batches_in_epoch(checkpoint: dict) -> tuple[int, bool] | None:
    """``(batches processed, whether the last was the epoch's last)`` of the training epoch a
    checkpoint (its loaded dict) was saved in; None where it holds no such state."""
    try:
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        return int(progress["current"]["processed"]), bool(progress.get("is_last_batch", False))
    except (KeyError, TypeError):
        return None


def reopen_cut_epoch(trainer: Trainer, checkpoint: dict) -> None:
    """Where ``fit`` ended before its epoch's last batch (``trainer.max_steps``, ``max_time``),
    Lightning closes the epoch on the way out: a checkpoint then saved counted it done while
    keeping its batch count, and a resume began the next epoch that many batches in (a
    finished run extended to more steps trained other blocks; probe 56). The saved epoch count
    is set back, so that the resume goes on inside the epoch, as one saved at that step's end
    does."""
    if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
        return  # the epoch ran to its end: done, rightly
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]
    for counts in (epochs["current"], epochs["total"]):
        if counts["completed"] == counts["ready"]:  # closed on the way out
            counts["processed"] -= 1
            counts["completed"] -= 1


def move_resumed_batches(trainer: Trainer, processed: int) -> None:
    """Have a fit resumed from a checkpoint count ``processed`` training batches of its epoch
    done, and its run-wide count what the same epochs hold in its own batches
    (``trainer.num_training_batches`` each) — Lightning validates on that count where it counts
    batches. Call it before the epoch loop resets (``on_train_start``). The counts move
    together, so their differences, which tell Lightning where in a batch the checkpoint was
    saved, are kept."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    epochs = trainer.fit_loop.epoch_progress.current.processed  # the epochs before this one
    before = epochs * trainer.num_training_batches
    shift = processed - progress.current.processed
    for name in ("ready", "started", "processed", "completed"):
        now = getattr(progress.current, name) + shift
        setattr(progress.current, name, now)
        setattr(progress.total, name, before + now)


def validates_after_this_batch(trainer: Trainer) -> bool:
    """Whether ``fit`` runs a validation right after the training batch that has just ended
    (asked from ``on_train_batch_end``; the loop decides it next, in ``on_advance_end``)."""
    loop = trainer.fit_loop
    epoch_loop = loop.epoch_loop
    if epoch_loop._skip_next_val:
        return False
    return bool(epoch_loop._should_check_val_fx(loop._data_fetcher))


def silence_eval_mode_warning(trainer: Trainer, count: int) -> None:
    """Drop Lightning's "Found N module(s) in eval mode at the start of training" warning in
    this trainer's next ``fit`` when N is ``count``; any other count still warns.

    Call it from ``on_fit_start`` (the check runs after it, as training starts). Lightning has no
    switch for the check, so this wraps the check on this trainer's fit loop alone and filters
    only while it runs. Should the check move, it falls back to a process-wide filter on the
    same text.
    """
    message = re.escape(EVAL_MODE_WARNING.format(count=count))
    loop = trainer.fit_loop
    loop.__dict__.pop(EVAL_MODE_CHECK, None)  # a second fit on this trainer: unwrap first
    check: Callable[[], None] | None = getattr(loop, EVAL_MODE_CHECK, None)
    if check is None:
        warnings.filterwarnings("ignore", message=message, category=PossibleUserWarning)
        return

    def filtered_check() -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=message, category=PossibleUserWarning)
            check()

    setattr(loop, EVAL_MODE_CHECK, filtered_check)


DDP_IGNORE = "_ddp_params_and_buffers_to_ignore"
"""The module attribute torch's DDP and Lightning's ``_sync_module_states`` leave out."""


def exclude_from_ddp(module: nn.Module, names: list[str]) -> None:
    """Leave ``module``'s parameters and buffers called ``names`` out of DDP: not broadcast from
    rank 0 when DDP (or Lightning, outside ``fit``) syncs the ranks, not in the reducer."""
    setattr(module, DDP_IGNORE, sorted({*getattr(module, DDP_IGNORE, ()), *names}))


def attached_trainer(module: LightningModule) -> Trainer | None:
    """The trainer ``module`` is attached to; None in ``load_from_checkpoint`` or a loop of
    one's own, where the public ``trainer`` property raises."""
    return module._trainer


def signal_started_processes(strategy, signum: int) -> None:
    """Hand ``signum`` to the processes ``strategy``'s launcher started (a DDP launch's further
    ranks, run as the same command again): Lightning's Trainer launchers ``kill`` them, Fabric's
    keeps them as ``procs``. Nothing for launchers that start none (torchrun, srun)."""
    launcher = getattr(strategy, "launcher", None)
    if callable(kill := getattr(launcher, "kill", None)):
        kill(signum)
        return
    for process in getattr(launcher, "procs", None) or []:
        if process.poll() is None:
            process.send_signal(signum)
