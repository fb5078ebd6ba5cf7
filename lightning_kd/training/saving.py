"""When checkpoints are written: every N optimizer steps, after each validation, at the end, and
when the run is interrupted — always at an optimizer-step boundary, so a resume is exact.

SIGINT and SIGTERM do not end training mid-step: the first one asks the run to stop
(:data:`~lightning_kd.utils.stopping.STOP`) and training stops after the current optimizer step
(all ranks agree on it), which then saves ``last.ckpt`` and raises :class:`RunInterrupted`; the
launch turns that into a non-zero exit (128 + the signal number) and prints the command that
resumes. When that step ends at a validation boundary, the validation runs first and the
checkpoint is written after it: a checkpoint taken before a boundary's validation would resume
past it (Lightning counts it as done), and early stopping would read another history. A
validation outside training (before it, or the final one) stops at its next batch. A second
SIGINT stops at once (the last checkpoint stays).

``checkpoint.keep`` and ``checkpoint.best`` keep earlier checkpoints besides ``last.ckpt``
(``training/kept_checkpoints.py``).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

from lightning_kd.training.checkpoints import LAST_NAME, REPAIR_NAME, SafeCheckpointIO
from lightning_kd.training.finite import NonFiniteError, check_finite_model
from lightning_kd.training.kept_checkpoints import (
    BEST_NAME,
    best_before,
    keep_as,
    keep_best,
    keep_step,
    set_aside_after,
)
from lightning_kd.utils.compat import reopen_cut_epoch, validates_after_this_batch
from lightning_kd.utils.stopping import STOP, Interrupted


class RunInterrupted(Interrupted):
    """Training stopped on a signal, after saving a checkpoint at an optimizer-step boundary."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        super().__init__(signum, f"after optimizer step {step}", f"saved {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


def agreed(trainer: Trainer) -> Callable[[bool], bool]:
    """``asked -> whether any rank was asked``: a collective every rank calls at one point."""

    def any_rank(asked: bool) -> bool:
        if trainer.world_size > 1:
            return bool(trainer.strategy.reduce_boolean_decision(asked, all=False))
        return asked

    return any_rank


def replaces_whole(trainer: Trainer) -> bool:
    """Whether ``trainer`` writes a checkpoint beside the old one and renames it over (a hard
    link to the old one stays whole); another checkpoint IO may rewrite it in place."""
    return isinstance(trainer.strategy.checkpoint_io, SafeCheckpointIO)


class LastCheckpoint(Checkpoint):
    """Keeps ``dirpath/last.ckpt`` current (see the module doc), and the ``keep`` most recent
    besides as ``step-<N>.ckpt`` (-1: every one), and ``best.ckpt``, that of the best
    validation by the metric ``best`` (None: none)."""

    def __init__(self, dirpath: str, every: int = 50, keep: int = 0, best: str | None = None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint.every={every!r}: must be an integer >= 1; e.g. 50")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < -1:
            raise ValueError(
                f"checkpoint.keep={keep!r}: must be an integer, the checkpoints kept besides "
                "last.ckpt: 0 none, -1 every one; e.g. 3"
            )
        if best is not None and not (isinstance(best, str) and best.startswith("val/")):
            raise ValueError(
                f"checkpoint.best={best!r}: must name a validation metric; e.g. val/ppl "
                "(checkpoint.best=null keeps none)"
            )
        self.dirpath = Path(dirpath)
        self.every, self.keep = every, keep
        self.monitor = best
        """The metric ``best.ckpt`` is kept by: checked against validation's names as early
        stopping's is (``training/metrics.py``)."""
        self.monitor_key = "checkpoint.best"
        self.saved_step: int | None = None
        """Optimizer step of the checkpoint last written or loaded (None: none yet)."""
        self._installed = False  # whether this callback installed the stop handlers
        self._validating = False  # ... for a validation of its own (on_validation_start)
        self.started = False
        """Whether training started in this process (a failure before it has nothing to add)."""
        self.start_step = 0
        """The optimizer step training started from (a resume's checkpoint's)."""
        self._step_seen = 0
        self._at_boundary = False  # no micro-batch has run since the last optimizer step
        self._stopping = False  # a stop was agreed on: raise before the next batch
        self._link = True  # kept checkpoints as hard links: replaces_whole, as training starts
        self._ending = False  # saving as fit ends: a cut epoch is saved open (on_save_checkpoint)

    @property
    def path(self) -> Path:
        return self.dirpath / LAST_NAME

    @property
    def stopping(self) -> bool:
        """Whether the ranks agreed to stop before the next step: it will not be trained."""
        return self._stopping

    @property
    def wrote_own(self) -> bool:
        """Whether this run wrote a checkpoint past the step it started from (a resume's
        settings, ``resume_reset_optimizer`` among them, are then that checkpoint's own)."""
        return self.saved_step is not None and self.saved_step > self.start_step

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.started = True
        self._link = replaces_whole(trainer)
        self._step_seen = self.start_step = trainer.global_step
        self._at_boundary = True
        if trainer.global_step > 0:  # resumed: that step's checkpoint exists already
            self.saved_step = trainer.global_step
            if trainer.is_global_zero:
                self._set_aside_later(trainer, pl_module)
            for logger in trainer.loggers if trainer.is_global_zero else ():
                if hasattr(logger, "drop_rows_from"):  # rows after the checkpoint come again
                    validated = pl_module.validation_at(trainer.global_step) is not None
                    logger.drop_rows_from(trainer.global_step, validated)
        # In place already when the launch installed them for all its stages; a Trainer of the
        # user's own gets them for training.
        STOP.install()
        self._installed = True
        # Asked while the models loaded or fit set up: stopped before a step that would only
        # have been saved (with a compile of the loss first), and nothing trained is lost.
        if agreed(trainer)(STOP.requested):
            raise Interrupted(STOP.signum or signal.SIGTERM, "as training started")

    def _set_aside_later(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A rollback (a resume from a kept checkpoint): the abandoned steps' checkpoints and
        log set aside, and the resumed one made ``last.ckpt`` (``ckpt_path=last`` goes on
        from it) and, where its own validation is recorded, the best so far."""
        resumed = Path(trainer.ckpt_path) if trainer.ckpt_path else None
        logs = [Path(lg.log_dir) / "metrics.csv" for lg in trainer.loggers if lg.log_dir]
        step, log = trainer.global_step, next(iter(logs), None)
        aside = set_aside_after(self.dirpath, step, resumed, log)
        if aside is None:
            return
        switched = resumed is not None and not resumed.is_file()  # brought back, its branch too
        source = self.dirpath / resumed.name if switched else resumed
        if source is not None and source.is_file():
            keep_as(source, self.path, self._link)
        went = "went on from a branch set aside, at" if switched else "rolled back to"
        print(
            f"\n{went} optimizer step {step}: the later checkpoints and the log as it stood "
            f"are kept in {aside}"
        )
        if self.monitor and not (self.dirpath / BEST_NAME).exists():
            self._best_again(pl_module, step, log)

    def _best_again(self, pl_module: LightningModule, step: int, log: Path | None) -> None:
        """``best.ckpt`` after a rollback set it aside: the best validation up to ``step`` of
        those whose checkpoint is on disk."""
        validated = getattr(pl_module, "validation_at", lambda _: None)(step) or {}
        if found := best_before(self.dirpath, self.monitor, log, step, validated):
            best_step, value, source = found
            keep_best(self.dirpath, self.monitor, value, best_step, self._link, source)
            print(f"{BEST_NAME} starts again at step {best_step} ({self.monitor} {value:.6g})")

    def on_train_batch_start(self, trainer: Trainer, *args) -> None:
        # Raised here, not right after the save: Lightning logs the step's metrics after
        # on_train_batch_end, and the logs should hold every step the checkpoint holds.
        if self._stopping:
            for logger in trainer.loggers:
                logger.save()
            raise RunInterrupted(STOP.signum or signal.SIGTERM, trainer.global_step, self.path)
        self._at_boundary = False

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if trainer.global_step == self._step_seen:
            return  # inside an accumulation window: no optimizer step yet
        self._step_seen = trainer.global_step
        self._at_boundary = True
        self._stopping = agreed(trainer)(STOP.requested)
        if validates_after_this_batch(trainer):
            return  # saved after the validation (see the module doc)
        if self._stopping or trainer.global_step % self.every == 0:
            self.save(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # A validation of its own (before or after training) runs under Lightning's SIGTERM
        # handler, whose notice is a broadcast from the rank it reached: one rank signalled
        # alone waited in it forever. The stop is asked for at this stage's clean points.
        if trainer.state.fn == TrainerFn.VALIDATING and not self._validating:
            STOP.install()
            self._validating = True

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._validating:
            STOP.uninstall()
            self._validating = False
            # The final validation, of the weights last.ckpt holds: they may be the best.
            if self.started and self.saved_step == trainer.global_step:
                self._keep_if_best(trainer)
        self.save_after_validation(trainer, pl_module)

    def on_validation_batch_end(self, trainer: Trainer, *args) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # a validation of its own: nothing to finish
            STOP.check("during the validation", agreed(trainer))

    def save_after_validation(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Inside an accumulation window (a validation every N batches of a Trainer of one's own)
        # no state can be resumed exactly: the next step boundary saves, and stops.
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking
        if fitting and self._at_boundary:
            self._stopping = self._stopping or agreed(trainer)(STOP.requested)
            self.save(trainer, pl_module)
            self._keep_if_best(trainer)

    def _keep_if_best(self, trainer: Trainer) -> None:
        value = trainer.callback_metrics.get(self.monitor) if self.monitor else None
        if value is not None and trainer.is_global_zero and self.saved_step is not None:
            keep_best(self.dirpath, self.monitor, float(value), self.saved_step, self._link)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ending = True
        self.save(trainer, pl_module)
        self._ending = False
        self._uninstall()

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        if self._ending:  # a fit cut inside its epoch resumes inside it
            reopen_cut_epoch(trainer, checkpoint)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception) -> None:
        self._uninstall()
        # Only an optimizer-step boundary is a state a resume can continue exactly from; one
        # process only, since a save is a collective the other ranks would not join.
        if (
            self._at_boundary
            and trainer.world_size == 1
            and not isinstance(exception, Interrupted | NonFiniteError)
        ):
            try:
                self.save(trainer, pl_module)
            except Exception as err:  # the original exception is the one to report
                print(f"no checkpoint saved on the way out: {err}", file=sys.stderr)

    def _uninstall(self) -> None:
        if self._validating:
            STOP.uninstall()
            self._validating = False
        if self._installed:
            STOP.uninstall()
            self._installed = False

    def save(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write ``last.ckpt`` for the current step, unless it is written already."""
        if trainer.global_step == 0 or self.saved_step == trainer.global_step:
            return
        self._refuse_non_finite(trainer, pl_module)
        # weights_only=False: the full training state (optimizer, loops), said explicitly so that
        # Lightning does not log that it defaulted.
        trainer.save_checkpoint(self.path, weights_only=False)
        self.saved_step = trainer.global_step
        if trainer.is_global_zero:  # after save_checkpoint's barrier: every rank's part is in
            keep_step(self.dirpath, self.saved_step, self.keep, self._link)
            (self.dirpath / REPAIR_NAME).unlink(missing_ok=True)  # its repair: in last.ckpt
        for logger in trainer.loggers:  # the logs on disk match the checkpoint
            logger.save()

    def _refuse_non_finite(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Raise :class:`NonFiniteError`, on every rank, if any rank's student weights hold a NaN
        or an infinity. The ranks decide together: a sharded rank may hold the only NaN, and a
        save is a collective that a rank left alone in would wait in forever."""
        student = getattr(pl_module, "student", None)
        what = f"saving {self.path}"
        try:
            if student is not None:
                check_finite_model(student, what, trainer.global_step)
        except NonFiniteError:
            if trainer.world_size > 1:
                trainer.strategy.reduce_boolean_decision(True, all=False)
            raise
        if trainer.world_size > 1 and trainer.strategy.reduce_boolean_decision(False, all=False):
            raise NonFiniteError(
                f"another rank's student weights are not finite after optimizer step "
                f"{trainer.global_step}: {what} is refused"
            )
