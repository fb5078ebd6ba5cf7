"""What ended training before ``trainer.max_steps``, for the run's summary: an early-stopping
callback (the run is finished) or ``trainer.max_time`` (it is not). Both ended the run as a
finished one, without a word (probe 47)."""

from __future__ import annotations

from datetime import timedelta

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer

EARLY_STOPPING = "early_stopping"
MAX_TIME = "max_time"
"""A summary's ``stopped_by``: what ended training before ``trainer.max_steps``."""


def stop_reason(trainer: Trainer) -> tuple[str | None, str | None]:
    """What ended training before ``trainer.max_steps`` (``early_stopping`` or ``max_time``)
    and why (Lightning's reason, at which step), or ``(None, None)``: both ended the run as a
    finished one, without a word (probe 47)."""
    at = f"(optimizer step {trainer.global_step} of {trainer.max_steps})"
    for callback in trainer.early_stopping_callbacks:
        if reason := getattr(callback, "stopping_reason_message", None):
            reason = reason.strip().removesuffix(" Signaling Trainer to stop.")
            return EARLY_STOPPING, f"{reason} {at}"
    timers = [callback for callback in trainer.callbacks if isinstance(callback, Timer)]
    left = [timer.time_remaining() for timer in timers]
    if any(seconds is not None and seconds <= 0 for seconds in left) and (
        trainer.max_steps < 0 or trainer.global_step < trainer.max_steps
    ):
        spent = timedelta(seconds=round(timers[0].time_elapsed("train")))
        return MAX_TIME, (
            f"trainer.max_time reached after {spent} of training, every launch's together "
            f"{at}: the run is unfinished; ckpt_path=last with a larger trainer.max_time goes on"
        )
    return None, None


class DecidedStop(Callback):
    """A resumed run whose early stopping had spent its patience at the checkpoint's
    validation stops there: the checkpoint holds the callback's counters but not Lightning's
    ``should_stop``, so a run stopped by a signal in that step trained on until the next
    validation stopped it again (3 steps more, another student; probe 47)."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for callback in trainer.early_stopping_callbacks:
            spent = callback.patience and callback.wait_count >= callback.patience
            if trainer.global_step and spent:
                trainer.should_stop = True
                callback.stopping_reason_message = (  # Lightning's words, as it stopped it
                    f"Monitored metric {callback.monitor} did not improve in the last "
                    f"{callback.wait_count} records. Best score: {float(callback.best_score):.3f}."
                )
