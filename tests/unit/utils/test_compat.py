"""Lightning's private API that ``lightning_kd.utils.compat`` relies on is still there and still
behaves.

A failure here names what changed in Lightning: fix ``lightning_kd/utils/compat.py`` to match.
"""

from __future__ import annotations

import inspect
import re
import signal
import subprocess
import sys
import warnings

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch import nn

from lightning_kd.utils import compat
from lightning_kd.utils.compat import signal_started_processes


def quiet_trainer(tmp_path, **kwargs) -> Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "enable_checkpointing": False,
        "default_root_dir": tmp_path,
    } | kwargs
    return Trainer(**options)


def test_fsdp_strategy_still_wraps_the_module_in_setup_model() -> None:
    method = getattr(FSDPStrategy, "_setup_model", None)
    assert method is not None, "FSDPStrategy._setup_model is gone: compat.FSDPStrategyWithWrapHook"
    assert list(inspect.signature(method).parameters) == ["self", "model"], (
        f"FSDPStrategy._setup_model{inspect.signature(method)} no longer takes just the model"
    )
    assert "self._setup_model(self.model)" in inspect.getsource(FSDPStrategy.setup), (
        "FSDPStrategy.setup no longer wraps the LightningModule through _setup_model"
    )
    assert compat.FSDPStrategyWithWrapHook._setup_model is not FSDPStrategy._setup_model


class RecordsResumedBatches(BoringModel):
    """A BoringModel (64 batches an epoch) that notes what compat reads as its loader is built."""

    def __init__(self) -> None:
        super().__init__()
        self.resumed: list[int] = []

    def train_dataloader(self):
        self.resumed.append(compat.resumed_batches_in_epoch(self.trainer))
        return super().train_dataloader()


# The BoringModel's loader is a plain one; ours (loaders.ResumableLoader) skips what compat reads.
@pytest.mark.filterwarnings("ignore:You're resuming from a checkpoint that ended before")
def test_resumed_batches_in_epoch_reads_the_restored_loop(tmp_path) -> None:
    fit_loop = quiet_trainer(tmp_path).fit_loop
    assert isinstance(fit_loop.restarting, bool), "fit_loop.restarting is gone"
    progress = fit_loop.epoch_loop.batch_progress.current
    assert isinstance(progress.processed, int), "epoch_loop.batch_progress.current.processed"

    first = RecordsResumedBatches()
    quiet_trainer(tmp_path, max_steps=3).fit(first)
    assert first.resumed == [0]  # a fresh fit
    checkpoint = tmp_path / "mid_epoch.ckpt"
    first.trainer.save_checkpoint(checkpoint)
    saved = torch.load(checkpoint, weights_only=False)
    assert compat.saved_batches_in_epoch(saved) == (3, False), "loops.fit_loop batch_progress"
    assert compat.saved_batches_in_epoch({"loops": {}}) is None
    epochs = saved["loops"]["fit_loop"]["epoch_progress"]  # what reopen_cut_epoch sets back
    assert {"ready", "processed", "completed"} <= set(epochs["current"]) & set(epochs["total"])

    again = RecordsResumedBatches()
    quiet_trainer(tmp_path, max_steps=5).fit(again, ckpt_path=checkpoint)
    assert again.resumed == [3], "a fit resumed after 3 of 64 batches must read 3"


def test_move_resumed_batches_keeps_where_in_a_batch_the_checkpoint_was_saved(tmp_path) -> None:
    """Saved on a batch's end in the second epoch: every count 6 but ``completed`` 5; moved to
    12 of an epoch of 20 batches, the run-wide count is the first epoch's 20 and these 12."""
    trainer = quiet_trainer(tmp_path)
    trainer.fit_loop.max_batches = 20  # trainer.num_training_batches
    trainer.fit_loop.epoch_progress.current.processed = 1  # one epoch done
    progress = trainer.fit_loop.epoch_loop.batch_progress
    for counts in (progress.current, progress.total):
        counts.ready, counts.started, counts.processed, counts.completed = 6, 6, 6, 5
    compat.move_resumed_batches(trainer, 12)
    for counts, before in ((progress.current, 0), (progress.total, 20)):
        moved = (counts.ready, counts.started, counts.processed, counts.completed)
        assert moved == (before + 12, before + 12, before + 12, before + 11), "batch_progress"


class WithEvalModule(BoringModel):
    """A BoringModel with one module in eval mode, silencing the warning for ``silenced``."""

    def __init__(self, silenced: int | None) -> None:
        super().__init__()
        self.frozen = nn.Linear(32, 32).eval()
        self.silenced = silenced

    def on_fit_start(self) -> None:
        if self.silenced is not None:
            compat.silence_eval_mode_warning(self.trainer, self.silenced)


def eval_mode_warnings(tmp_path, model: BoringModel, trainer: Trainer | None = None) -> list[str]:
    """The eval-mode warnings a 1-step fit of ``model`` emits."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (trainer or quiet_trainer(tmp_path, max_steps=1)).fit(model)
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, PossibleUserWarning) and "eval mode" in str(w.message)
    ]


def test_eval_mode_warning_text_and_check_are_what_compat_filters(tmp_path) -> None:
    assert callable(getattr(quiet_trainer(tmp_path).fit_loop, compat.EVAL_MODE_CHECK, None)), (
        f"_FitLoop.{compat.EVAL_MODE_CHECK} is gone: the warning's check moved"
    )
    emitted = eval_mode_warnings(tmp_path, WithEvalModule(silenced=None))
    expected = compat.EVAL_MODE_WARNING.format(count=1)
    assert len(emitted) == 1 and emitted[0].startswith(expected), (
        f"Lightning's eval-mode warning now reads {emitted!r}, not {expected!r}…"
    )


def test_silencing_drops_only_that_count_and_leaves_no_process_wide_filter(tmp_path) -> None:
    filters = list(warnings.filters)
    assert eval_mode_warnings(tmp_path, WithEvalModule(silenced=1)) == []
    assert warnings.filters == filters
    still = eval_mode_warnings(tmp_path, WithEvalModule(silenced=2))
    assert len(still) == 1 and re.match(r"Found 1 module\(s\)", still[0])


def test_silencing_again_on_one_trainer_replaces_the_count(tmp_path) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=1)
    compat.silence_eval_mode_warning(trainer, 1)
    compat.silence_eval_mode_warning(trainer, 2)  # a second fit's count: 1 no longer silenced
    assert len(eval_mode_warnings(tmp_path, WithEvalModule(silenced=None), trainer)) == 1


def test_ddp_and_lightnings_sync_leave_out_what_exclude_from_ddp_names() -> None:
    from lightning.pytorch.overrides import distributed as lightning_ddp
    from torch.nn.parallel import distributed as torch_ddp

    for where in (torch_ddp.DistributedDataParallel.__init__, lightning_ddp._sync_module_states):
        assert compat.DDP_IGNORE in inspect.getsource(where), f"{where.__qualname__} moved"
    module = nn.Linear(2, 2)
    compat.exclude_from_ddp(module, ["weight"])
    compat.exclude_from_ddp(module, ["bias"])
    assert getattr(module, compat.DDP_IGNORE) == ["bias", "weight"]


def test_attached_trainer_is_none_until_a_trainer_holds_the_module(tmp_path) -> None:
    module = BoringModel()
    assert compat.attached_trainer(module) is None
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        module.trainer  # noqa: B018 (the public property raises: why compat reads _trainer)
    trainer = quiet_trainer(tmp_path, max_steps=1, limit_train_batches=1)
    trainer.fit(module)
    assert compat.attached_trainer(module) is trainer


def test_the_processes_a_launcher_started_are_handed_the_signal() -> None:
    """A SIGTERM to the launching process while rank 1 was still starting left rank 1 running
    as an orphan (ppid 1), holding its models, waiting to join a store that was gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    strategy = DDPStrategy()
    strategy._launcher = _SubprocessScriptLauncher(strategy.cluster_environment, 2, 1)
    strategy.launcher.procs.append(child)  # as its _call_children_scripts records them
    signal_started_processes(strategy, signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    signal_started_processes(object(), signal.SIGTERM)  # torchrun, srun: none started here


def test_the_processes_fabrics_launcher_started_are_handed_the_signal() -> None:
    """``lightning-kd cache`` launches through Fabric, whose launcher has no ``kill``: its
    children are read from ``procs``, as its ``_call_children_scripts`` records them."""
    from lightning.fabric.strategies import DDPStrategy as FabricDDP
    from lightning.fabric.strategies.launchers.subprocess_script import (
        _SubprocessScriptLauncher as FabricLauncher,
    )

    assert not hasattr(FabricLauncher, "kill")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    strategy = FabricDDP()
    strategy._launcher = FabricLauncher(strategy.cluster_environment, 2, 1)
    strategy.launcher.procs.append(child)
    signal_started_processes(strategy, signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


class RecordsValidations(BoringModel):
    """Notes, at each validation inside fit, the optimizer steps done and whether the batch
    before it left its accumulation window open (no step taken)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, bool]] = []

    def on_validation_start(self) -> None:
        loop = self.trainer.fit_loop.epoch_loop
        self.seen.append((self.trainer.global_step, loop._should_accumulate()))


def test_validations_every_n_steps_stay_on_step_boundaries_across_epochs(tmp_path) -> None:
    """64 batches an epoch at 3 a step: 21 whole windows and one of a batch. Lightning counts
    the interval in batches (2 steps: 6) across epochs: from the second epoch on, every
    validation fell inside a window (probe 47)."""
    options = {"max_steps": 50, "accumulate_grad_batches": 3, "limit_val_batches": 1}
    lightning = RecordsValidations()
    quiet_trainer(tmp_path, val_check_interval=30, check_val_every_n_epoch=None, **options).fit(
        lightning
    )
    assert any(open_window for _, open_window in lightning.seen)  # what was fixed

    stepped = RecordsValidations()
    trainer = quiet_trainer(
        tmp_path, val_check_interval=30, check_val_every_n_epoch=None, **options
    )
    compat.validate_every_steps(trainer, 10)
    trainer.fit(stepped)
    assert stepped.seen == [(step, False) for step in (10, 20, 30, 40, 50)]
