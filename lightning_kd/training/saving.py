"""When checkpoints are written: every N optimizer steps, at each validation, at the end, and
when the run is interrupted — always at an optimizer-step boundary, so a resume is exact.

SIGINT and SIGTERM do not end training mid-step: the first one asks the run to stop after the
current optimizer step (all ranks agree on it), which then saves ``last.ckpt`` and raises
:class:`RunInterrupted`; ``run.py`` turns that into a non-zero exit (128 + the signal number) and
prints the command that resumes. A second SIGINT stops at once (the last checkpoint stays).
Lightning's own SIGTERM handling, which ends ``fit`` with exit 0 and saves nothing, is replaced
for the duration of training.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.trainer.states import TrainerFn

from lightning_kd.training.checkpoints import LAST_NAME
from lightning_kd.training.finite import NonFiniteError, check_finite_model

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """Training stopped on a signal, after saving a checkpoint at an optimizer-step boundary."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(
            f"{name} received: stopped after optimizer step {step}, saved {checkpoint}"
        )

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal."""
        return 128 + self.signum


class StopRequest:
    """SIGINT/SIGTERM handlers that record a request to stop instead of stopping."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, the last checkpoint stays
        self.signum = self.signum or signum
        print(
            f"\n{signal.Signals(signum).name} received: stopping after the current optimizer "
            "step and saving a checkpoint (Ctrl+C again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def agreed(self, trainer: Trainer) -> bool:
        """Whether any rank was asked to stop (a collective: every rank calls it each step)."""
        asked = self.signum is not None
        if trainer.world_size > 1:
            return bool(trainer.strategy.reduce_boolean_decision(asked, all=False))
        return asked


class LastCheckpoint(Checkpoint):
    """Keeps ``dirpath/last.ckpt`` current (see the module doc)."""

    def __init__(self, dirpath: str, every: int = 50) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"checkpoint.every={every!r}: must be an integer >= 1; e.g. 50")
        self.dirpath = Path(dirpath)
        self.every = every
        self.saved_step: int | None = None
        """Optimizer step of the checkpoint last written or loaded (None: none yet)."""
        self.stop = StopRequest()
        self._step_seen = 0
        self._at_boundary = False  # no micro-batch has run since the last optimizer step
        self._stopping = False  # a stop was agreed on: raise before the next batch or validation

    @property
    def path(self) -> Path:
        return self.dirpath / LAST_NAME

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step_seen = trainer.global_step
        self._at_boundary = True
        if trainer.global_step > 0:  # resumed: that step's checkpoint exists already
            self.saved_step = trainer.global_step
            for logger in trainer.loggers if trainer.is_global_zero else ():
                if hasattr(logger, "drop_rows_from"):  # rows after the checkpoint come again
                    logger.drop_rows_from(trainer.global_step)
        self.stop.install()

    def on_train_batch_start(self, trainer: Trainer, *args) -> None:
        self._raise_if_stopping(trainer)
        self._at_boundary = False

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if trainer.global_step == self._step_seen:
            return  # inside an accumulation window: no optimizer step yet
        self._step_seen = trainer.global_step
        self._at_boundary = True
        self._stopping = self.stop.agreed(trainer)
        if self._stopping or trainer.global_step % self.every == 0:
            self.save(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raise_if_stopping(trainer)

    def _raise_if_stopping(self, trainer: Trainer) -> None:
        # Raised here, not right after the save: Lightning logs the step's metrics after
        # on_train_batch_end, and the logs should hold every step the checkpoint holds.
        if self._stopping:
            for logger in trainer.loggers:
                logger.save()
            raise RunInterrupted(self.stop.signum or signal.SIGTERM, trainer.global_step, self.path)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.save(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.save(trainer, pl_module)
        self.stop.uninstall()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception) -> None:
        self.stop.uninstall()
        # Only an optimizer-step boundary is a state a resume can continue exactly from; one
        # process only, since a save is a collective the other ranks would not join.
        if (
            self._at_boundary
            and trainer.world_size == 1
            and not isinstance(exception, RunInterrupted | NonFiniteError)
        ):
            try:
                self.save(trainer, pl_module)
            except Exception as err:  # the original exception is the one to report
                print(f"no checkpoint saved on the way out: {err}", file=sys.stderr)

    def save(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Write ``last.ckpt`` for the current step, unless it is written already."""
        if trainer.global_step == 0 or self.saved_step == trainer.global_step:
            return
        self._refuse_non_finite(trainer, pl_module)
        # weights_only=False: the full training state (optimizer, loops), said explicitly so that
        # Lightning does not log that it defaulted.
        trainer.save_checkpoint(self.path, weights_only=False)
        self.saved_step = trainer.global_step
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


def stop_report(error: BaseException, callback: object, resume: str) -> str:
    """What a stopped run tells its user: why, which checkpoint is left, how to resume."""
    saved = getattr(callback, "saved_step", None)
    path = getattr(callback, "path", None)
    if isinstance(error, RunInterrupted):
        why = str(error)
    else:
        why = f"training stopped: {type(error).__name__}: {error}".split("\n")[0]
    if saved is None or path is None:
        return f"\n{why}\nNo checkpoint was written: there is nothing to resume from."
    return (
        f"\n{why}\nThe latest checkpoint is {path} (optimizer step {saved}). Resume with:\n"
        f"  {resume}"
    )
