"""Callbacks tests inject into real runs: +callbacks.<name>={_target_: tests.helpers.<Name>}."""

from __future__ import annotations

import os
import signal
import signal as signal_module

from lightning.pytorch import Callback


class KillAtStep(Callback):
    """SIGKILL this process as optimizer step ``step`` begins: a crash, with no cleanup at all.

    The checkpoint of step ``step`` has been written by then (checkpoint callbacks run at the end
    of the previous batch).
    """

    def __init__(self, step: int, rank: int | None = None) -> None:
        self.step = step
        self.rank = rank  # only this global rank dies (None: every rank), as one node would

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), signal.SIGKILL)


class LifecycleProbe(Callback):
    """Fail the run if any capture is armed or holds a tensor after a training batch."""

    def on_train_batch_end(self, trainer, module, *args) -> None:
        for capture in module.distiller.captures.values():
            if capture.armed or capture.records:
                raise AssertionError(
                    f"rank {trainer.global_rank}: capture {capture.role} left "
                    f"armed={capture.armed} records={sorted(capture.records)}"
                )


class SignalAtStep(Callback):
    """Send this process ``signal`` (a name: SIGINT, SIGTERM) as the micro-batch at ``batch``
    begins: mid-run, mid-accumulation-window when ``batch`` is not a window's first."""

    def __init__(self, batch: int, signal: str) -> None:
        self.batch, self.signum = batch, getattr(signal_module, signal)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.fit_loop.total_batch_idx == self.batch:
            os.kill(os.getpid(), self.signum)


class KillDuringCheckpointWrite(Callback):
    """SIGKILL this process while it writes the checkpoint of optimizer step ``step``: after the
    bytes are in the temporary file, before it replaces ``last.ckpt`` (a crash mid-write)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if trainer.global_step == self.step:
            import lightning_kd.training.checkpoints as checkpoints

            def crash(fd: int) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            checkpoints.os.fsync = crash


class FixedCompletions(Callback):
    """Stands in for the student's sampler under ``distill.on_policy``: each prompt's completion
    is a function of the prompt alone (its last tokens reversed, 1 to 6 of them), so one process
    and two ranks see the same completions — of different lengths — whatever the batches."""

    def on_fit_start(self, trainer, module) -> None:
        module.distiller.on_policy = _PromptFunction()


class _PromptFunction:
    def __init__(self) -> None:
        from lightning_kd.distill.on_policy import Tally

        self.tally = Tally()  # nothing interleaved: the module reads no share from it
        self.teacher_top_k = None

    def replace(self, student, batch, draw, step=0, teacher=None):
        from lightning_kd.generation.decoding import completions_batch, prompt_tokens

        prompts = prompt_tokens(batch)
        completions = [p.flip(0)[: 1 + int(p.sum()) % 6] for p in prompts]
        return completions_batch(prompts, completions, pad_id=0)


class SignalAtFitStart(Callback):
    """Send this process ``signal`` as ``fit`` starts: before the block-wise repair (a callback
    the module adds after the trainer's own), which then stops at its first step."""

    def __init__(self, signal: str) -> None:
        self.signum = getattr(signal_module, signal)

    def on_fit_start(self, trainer, pl_module) -> None:
        os.kill(os.getpid(), self.signum)


class SignalInFinalValidation(Callback):
    """Send this process ``signal`` as the first batch of the validation after training (a
    ``validate`` of its own, at the last step) begins; on global rank ``rank`` alone, if given."""

    def __init__(self, signal: str, rank: int | None = None) -> None:
        self.signum, self.rank = getattr(signal_module, signal), rank

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        final = trainer.state.fn == "validate" and trainer.global_step == trainer.max_steps
        mine = self.rank is None or trainer.global_rank == self.rank
        if final and batch_idx == 0 and mine:
            os.kill(os.getpid(), self.signum)


class RecordBatches(Callback):
    """Write each training batch's token rows, as this rank trains them, to
    ``directory/rank<global rank>.jsonl`` (one line per batch)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import json
        from pathlib import Path

        path = Path(self.directory) / f"rank{trainer.global_rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(json.dumps(batch["input_ids"].tolist()) + "\n")
