"""``checkpoint.best``: the best validation's student, exported beside the final one.

``checkpoints/best.ckpt`` holds a training state; what a run ships is a ``save_pretrained``
student, and none could be had from that checkpoint without training code of one's own (the
frozen layers a LoRA student leaves out of its checkpoints included). Once the final student is
exported, the best one is too, as ``student-best/``, where it is another step's: its weights are
loaded into the run's student (whose frozen ones it shares) and exported the same way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from lightning_kd.training.checkpoint_files import load_local
from lightning_kd.training.checkpoints import STUDENT_PREFIX
from lightning_kd.training.kept_checkpoints import BEST_NAME, read_best
from lightning_kd.training.rundir import EARLIER, is_rank_zero

BEST_DIR = "student-best"
"""The best validation's student in the run directory (``checkpoint.best``)."""


def export_best(
    module, output_dir: Path, export: Callable[[object, Path], None], metric: str | None
) -> dict | None:
    """Export ``checkpoints/best.ckpt``'s student into ``output_dir/student-best`` with
    ``export`` (as the final student was) where it is not the final student; ``best.json``'s
    record with where that student is (``student/`` for the final one), or None without one
    (``metric``: ``checkpoint.best``, None where it is off). A ``student-best/`` that is not
    this best's moves to ``earlier/``. The run's student holds the best weights afterwards."""
    checkpoints = output_dir / "checkpoints"
    record, trainer = read_best(checkpoints), module.trainer
    if metric is None or record is None or record.get("metric") != metric:
        retire(output_dir, trainer.global_step)  # off on this resume: best.ckpt is stale
        return None
    if not (checkpoints / BEST_NAME).exists():
        return None
    if record.get("step") == trainer.global_step:
        retire(output_dir, trainer.global_step)  # a better one since: the final student
        return record | {"student": "student"}
    # DeepSpeed's checkpoint is a directory; FSDP wraps the student in place.
    whole = isinstance(trainer.strategy, SingleDeviceStrategy | DDPStrategy)
    if not (checkpoints / BEST_NAME).is_file() or not whole:
        return record | {"student": f"not exported under {type(trainer.strategy).__name__}"}
    state = load_local(checkpoints / BEST_NAME, "cpu", mmap=True)["state_dict"]  # weights only read
    weights = {
        key.removeprefix(STUDENT_PREFIX): value
        for key, value in state.items()
        if key.startswith(STUDENT_PREFIX)
    }
    student = module.distiller.student
    trainable = {name for name, param in student.named_parameters() if param.requires_grad}
    loaded = student.load_state_dict(weights, strict=False)  # the frozen: the run's own
    wrong = loaded.unexpected_keys + sorted(trainable & set(loaded.missing_keys))
    if wrong:
        raise ValueError(
            f"{checkpoints / BEST_NAME} does not hold this run's student (keys {wrong[:3]}): it "
            "was not written by this run"
        )
    export(module, output_dir / BEST_DIR)
    return record | {"student": BEST_DIR}


def retire(output_dir: Path, step: int) -> None:
    """Move a ``student-best/`` that is not this run's best into ``earlier/`` (it read as the
    best beside a summary naming another; probe 50)."""
    if (best := output_dir / BEST_DIR).is_dir() and is_rank_zero():
        (output_dir / EARLIER).mkdir(exist_ok=True)
        target = output_dir / EARLIER / f"{BEST_DIR}-before-step-{step}"
        shutil.rmtree(target, ignore_errors=True)
        os.replace(best, target)
