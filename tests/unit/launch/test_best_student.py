"""``launch/best_student.py``: checkpoint.best's student exported beside the final one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from lightning_kd.launch.best_student import export_best
from lightning_kd.models.loading import TeacherSpec
from lightning_kd.training.checkpoints import STUDENT_PREFIX, SafeCheckpointIO
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import TINY_LLAMA, make_datamodule, make_module, make_trainer


def test_the_best_steps_student_is_exported_and_the_final_one_named_where_it_is_best(
    tmp_path: Path, corpus: Path
) -> None:
    """best.ckpt held a training state alone: a student to ship could not be had from it."""
    checkpoints = tmp_path / "checkpoints"
    saver = LastCheckpoint(str(checkpoints), every=1, keep=-1)
    trainer = make_trainer(
        tmp_path, max_steps=4, limit_val_batches=0, plugins=[SafeCheckpointIO()], callbacks=[saver]
    )
    module = make_module(TeacherSpec(path=None, config=dict(TINY_LLAMA)))
    trainer.fit(module, make_datamodule([corpus]))
    shutil.copyfile(checkpoints / "step-2.ckpt", checkpoints / "best.ckpt")  # as keep_best does
    record = {"metric": "val/ppl", "value": 9.0, "step": 2}
    (checkpoints / "best.json").write_text(json.dumps(record))
    exported = {}

    def export(module, directory: Path) -> None:
        exported[directory.name] = {k: v.clone() for k, v in module.student.state_dict().items()}

    assert export_best(module, tmp_path, export, "val/ppl") == record | {"student": "student-best"}
    saved = torch.load(checkpoints / "step-2.ckpt", weights_only=True)["state_dict"]
    for key, value in exported["student-best"].items():
        assert torch.equal(value, saved[STUDENT_PREFIX + key]), key

    (checkpoints / "best.json").write_text(json.dumps(record | {"step": 4}))  # the final one
    assert export_best(module, tmp_path, export, "val/ppl")["student"] == "student"
    (checkpoints / "best.json").unlink()
    assert export_best(module, tmp_path, export, "val/ppl") is None  # no checkpoint.best
    (tmp_path / "student-best").mkdir()  # from an earlier launch
    (checkpoints / "best.json").write_text(json.dumps(record | {"step": 4}))  # bettered since
    assert export_best(module, tmp_path, export, "val/ppl")["student"] == "student"
    assert not (tmp_path / "student-best").exists()  # it read as the best (probe 50)
    assert (tmp_path / "earlier" / "student-best-before-step-4").is_dir()
    (checkpoints / "best.json").write_text(json.dumps(record))
    assert export_best(module, tmp_path, export, None) is None  # checkpoint.best off: stale
