"""The block-wise repair as a stage of a fit: before the first optimizer step, each copied student
layer learns alone the teacher span it replaces (the loop itself: ``distill/repair.py``).

It runs at the start of ``fit`` because that is where every rank exists, the strategy has placed
the models and the precision plugin's forward context is set; it reads the training blocks the
fit will read, split between ranks as training splits them. A resumed fit starts from its
checkpoint, whose student was repaired already, and skips it.

No training checkpoint exists yet while it runs: its progress is kept in
``checkpoints/repair.pt`` every ``checkpoint.every`` repair steps and at a stop, and a fit that
starts with that file there (``ckpt_path=last`` before the first checkpoint) goes on from it,
exactly: the same batches, weights and optimizer state. The first checkpoint replaces it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only
from tqdm.auto import tqdm

from lightning_kd.data.loaders import passes_over, sharded_loader
from lightning_kd.distill.repair import Resumable, repair, repair_plan
from lightning_kd.distill.repair_progress import RepairReport
from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.training.checkpoints import REPAIR_NAME, atomic_torch_save
from lightning_kd.training.saving import LastCheckpoint, agreed
from lightning_kd.utils.plain_data import flat
from lightning_kd.utils.refusal import Refused
from lightning_kd.utils.stopping import STOP

REPORT_KEY = "blockwise_repair"
"""Where a checkpoint keeps the repair's report."""


class BlockwiseRepair(Callback):
    """``distill.blockwise_passes`` over the training blocks before the first step; the report
    goes to the module's ``blockwise`` (the run summary reads it)."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.distill.blockwise_passes and trainer.ckpt_path is None:
            pl_module.blockwise = self.repair(trainer, pl_module)
        pl_module.distiller.release_repair_source()  # student.source's model: repaired from

    # A resumed fit skips the repair its student already had: the checkpoint carries the report,
    # or the resumed run's summary said no repair was done.
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        if pl_module.blockwise is not None:
            checkpoint[REPORT_KEY] = pl_module.blockwise.as_dict()

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint) -> None:
        if REPORT_KEY in checkpoint:
            pl_module.blockwise = RepairReport.from_dict(checkpoint[REPORT_KEY])

    @staticmethod
    def repair(trainer: Trainer, pl_module: LightningModule) -> RepairReport:
        if trainer.datamodule is None:
            raise ValueError(
                "distill.blockwise_passes reads the training blocks from the data module: pass "
                "one to fit (datamodule=...), or set distill.blockwise_passes=0"
            )
        # A pass covers at most the batches training reads: on a large corpus, a few hundred
        # steps' worth (a different share each pass), not every block.
        steps = trainer.max_steps
        reads = steps * trainer.accumulate_grad_batches if steps and steps > 0 else None
        loader = sharded_loader(
            trainer.datamodule.train_dataloader(), trainer.world_size, trainer.global_rank, reads
        )
        distill = pl_module.distill
        steps_in_all = distill.blockwise_passes * len(loader)
        resumed = resumable(trainer, pl_module, loader, steps_in_all)
        saved = (resumed.saved or {}) if resumed is not None else {}
        ended, done = saved.get("report", {}).get("passes", 0), saved.get("done", 0)
        into = done - ended * len(loader)
        batches = passes_over(loader, distill.blockwise_passes, pl_module.device, ended, into)
        context = trainer.precision_plugin.forward_context
        shown = trainer.is_global_zero and trainer.progress_bar_callback is not None
        with tqdm(
            total=steps_in_all,
            initial=done,
            desc="block-wise repair",
            unit="step",
            disable=not shown,
        ) as bar:
            report = repair(
                pl_module.distiller,
                counted(batches, bar),
                steps_in_all,
                distill.blockwise_lr,
                context,
                stop=lambda: agreed(trainer)(STOP.requested),  # all ranks stop at one step
                resumed=resumed,
            )
        rank_zero_only(print)(report.line())
        return report


class RepairStateMismatch(Refused, ValueError):
    """``checkpoints/repair.pt`` was kept by a repair of other settings than this run's."""


def signature(trainer: Trainer, pl_module: LightningModule, loader, steps: int) -> dict:
    """What a kept repair must share with the one going on from it."""
    data = trainer.datamodule
    return {
        # What the repair's batches are drawn from and in which order: a resume from last.ckpt
        # refuses another data.seed or seed; one from repair.pt went on silently (probe 50).
        "data": data.provenance() if hasattr(data, "provenance") else None,
        "seed": os.environ.get("PL_GLOBAL_SEED"),
        "layers": [span.student for span in repair_plan(pl_module.distiller)],
        "steps": steps,
        "lr": float(pl_module.distill.blockwise_lr),
        "batches_a_pass": len(loader),
        "blocks": int(getattr(loader.sampler, "blocks", len(loader.dataset))),
        "batch_size": loader.batch_size,
        "processes": trainer.world_size,
    }


def resumable(trainer: Trainer, pl_module: LightningModule, loader, steps: int):
    """How this repair keeps its progress (None: no ``LastCheckpoint``, no run directory), with
    the progress a stopped one kept, checked to be of the same repair."""
    saver = next((c for c in trainer.callbacks if isinstance(c, LastCheckpoint)), None)
    if saver is None:
        return None
    path, expected = saver.dirpath / REPAIR_NAME, signature(trainer, pl_module, loader, steps)

    def keep(progress: dict) -> None:
        if trainer.is_global_zero:
            atomic_torch_save(progress | {"signature": expected}, path)

    saved = load_local(path, "cpu") if path.is_file() else None
    if saved is not None and saved.get("signature") != expected:
        kept, now = flat(saved.get("signature") or {}), flat(expected)
        changed = [
            f"{k}: kept {kept.get(k)!r:.60}, this run {v!r:.60}"
            for k, v in now.items()
            if kept.get(k) != v
        ]
        raise RepairStateMismatch(
            f"{path} holds a block-wise repair of other settings ({'; '.join(changed)}): go on "
            "with the settings it stopped with, or start again (without ckpt_path, with "
            "overwrite=true)"
        )
    return Resumable(keep, saver.every, saved, trainer.global_rank)


# The repair of the default run is minutes of a 2-core CPU's time before the first training step,
# and it printed nothing until it ended: it looked hung (probe 41).
def counted(passes: Iterable[Iterable], bar: tqdm) -> Iterator[Iterator]:
    """``passes`` (each an iterable of batches), counting each batch's step on ``bar`` once it
    is done: when the repair asks for the next batch, or for the end of the pass."""
    for batches in passes:
        yield _counted(batches, bar)


def _counted(batches: Iterable, bar: tqdm) -> Iterator:
    for batch in batches:
        yield batch
        bar.update(1)
