"""Checkpoints kept besides last.ckpt (checkpoint.keep, checkpoint.best) and a rollback to one."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lightning_kd.training.checkpoints import SafeCheckpointIO
from lightning_kd.training.kept_checkpoints import (
    best_before,
    better,
    keep_as,
    keep_best,
    keep_step,
    kept_steps,
    set_aside_after,
)
from lightning_kd.training.metrics_log import ResumableCSVLogger
from lightning_kd.training.saving import LastCheckpoint
from tests.conftest import make_datamodule, make_module, make_trainer


def write_last(directory: Path, step: int) -> Path:
    """``directory/last.ckpt`` for ``step``, replaced whole as the package writes it."""
    directory.mkdir(exist_ok=True)
    temp = directory / ".last.ckpt.tmp"
    torch.save({"global_step": step}, temp)
    temp.replace(directory / "last.ckpt")
    return directory / "last.ckpt"


def test_the_most_recent_are_kept_as_links_to_what_last_ckpt_was(tmp_path) -> None:
    for step in (2, 4, 6, 8):
        write_last(tmp_path, step)
        keep_step(tmp_path, step, keep=2)
    assert list(kept_steps(tmp_path)) == [6, 8]
    assert (tmp_path / "step-8.ckpt").samefile(tmp_path / "last.ckpt")  # no second copy
    assert torch.load(tmp_path / "step-6.ckpt")["global_step"] == 6  # kept when last moved on
    for step in (10, 12, 14):
        write_last(tmp_path, step)
        keep_step(tmp_path, step, keep=-1)
    assert list(kept_steps(tmp_path)) == [6, 8, 10, 12, 14]
    keep_step(tmp_path, 14, keep=0)
    assert list(kept_steps(tmp_path)) == [6, 8, 10, 12, 14]


def test_a_checkpoint_io_that_may_rewrite_in_place_gets_copies(tmp_path) -> None:
    """A checkpoint IO of one's own may truncate last.ckpt and write it again: a hard link to it
    would have become the next step's checkpoint."""
    write_last(tmp_path, 2)
    keep_step(tmp_path, 2, keep=-1, link=False)
    assert not (tmp_path / "step-2.ckpt").samefile(tmp_path / "last.ckpt")
    assert torch.load(tmp_path / "step-2.ckpt")["global_step"] == 2


def test_a_checkpoint_directory_is_copied_not_linked(tmp_path) -> None:
    """DeepSpeed rewrites the files of its checkpoint directory in place: a link would follow."""
    (tmp_path / "last.ckpt").mkdir()
    (tmp_path / "last.ckpt" / "shard").write_text("step 2")
    keep_as(tmp_path / "last.ckpt", tmp_path / "step-2.ckpt")
    (tmp_path / "last.ckpt" / "shard").write_text("step 4")
    assert (tmp_path / "step-2.ckpt" / "shard").read_text() == "step 2"
    keep_as(tmp_path / "last.ckpt", tmp_path / "step-2.ckpt")  # replaced whole
    assert (tmp_path / "step-2.ckpt" / "shard").read_text() == "step 4"


def test_better_is_lower_but_for_agreement_and_never_a_nan() -> None:
    assert better("val/ppl", 10.0, 11.0) and not better("val/ppl", 12.0, 11.0)
    assert better("val/agreement", 0.9, 0.8) and not better("val/agreement", 0.7, 0.8)
    assert better("val/kl", 5.0, None) and not better("val/kl", math.nan, None)


def test_the_best_is_kept_with_its_step_and_a_new_metric_starts_again(tmp_path) -> None:
    for step, ppl in ((2, 30.0), (4, 20.0), (6, 25.0)):
        write_last(tmp_path, step)
        keep_best(tmp_path, "val/ppl", ppl, step)
    assert json.loads((tmp_path / "best.json").read_text()) == {
        "metric": "val/ppl",
        "value": 20.0,
        "step": 4,
    }
    assert torch.load(tmp_path / "best.ckpt")["global_step"] == 4
    keep_best(tmp_path, "val/kl", 9.0, 6)  # the metric changed on a resume
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 6


def test_a_rollback_sets_the_later_steps_aside_with_the_log(tmp_path) -> None:
    for step in (2, 4, 6):
        write_last(tmp_path, step)
        keep_step(tmp_path, step, keep=-1)
        keep_best(tmp_path, "val/ppl", 10.0 - step, step)
    log = tmp_path / "metrics.csv"
    log.write_text("step,val/ppl\n2,8\n4,6\n6,4\n")
    aside = set_aside_after(tmp_path, 2, tmp_path / "step-2.ckpt", log)
    assert aside == tmp_path / "abandoned-after-step-2"
    moved = sorted(path.name for path in aside.iterdir())
    assert moved == [
        "best.ckpt",
        "best.json",
        "last.ckpt",
        "metrics.csv",
        "step-4.ckpt",
        "step-6.ckpt",
    ]
    assert list(kept_steps(tmp_path)) == [2]
    assert set_aside_after(tmp_path, 2, tmp_path / "step-2.ckpt", log) is None  # nothing later
    write_last(tmp_path, 4)  # the new branch reaches step 4, and is rolled back to 2 again
    keep_step(tmp_path, 4, keep=-1)
    again = set_aside_after(tmp_path, 2, tmp_path / "step-2.ckpt", log)
    assert again == tmp_path / "abandoned-after-step-2-2"  # the first branch's stay whole
    assert torch.load(aside / "step-4.ckpt")["global_step"] == 4
    assert sorted(p.name for p in again.iterdir()) == ["last.ckpt", "metrics.csv", "step-4.ckpt"]


def test_going_on_from_a_branch_set_aside_sets_the_current_one_aside_from_their_fork(
    tmp_path,
) -> None:
    """Resuming step 10 of a branch set aside at 6 while the current one stood at 8 set nothing
    aside: the log and the kept checkpoints mixed the two branches (probe 50)."""
    for step in (2, 4, 6, 8, 10):  # branch 1
        write_last(tmp_path, step)
        keep_step(tmp_path, step, keep=-1)
    log = tmp_path / "metrics.csv"
    log.write_text("step,train/loss\n2,1\n10,1\n")
    first = set_aside_after(tmp_path, 6, tmp_path / "step-6.ckpt", log)  # back to 6
    write_last(tmp_path, 8)  # branch 2 reaches 8
    keep_step(tmp_path, 8, keep=-1)
    log.write_text("step,train/loss\n2,1\n8,2\n")
    second = set_aside_after(tmp_path, 10, first / "step-10.ckpt", log)
    assert second == tmp_path / "abandoned-after-step-6-2"  # branch 2, from the fork
    assert sorted(p.name for p in second.iterdir()) == ["last.ckpt", "metrics.csv", "step-8.ckpt"]
    assert torch.load(second / "step-8.ckpt")["global_step"] == 8
    assert list(kept_steps(tmp_path)) == [2, 4, 6, 8, 10]  # branch 1's back
    assert torch.load(tmp_path / "step-8.ckpt")["global_step"] == 8
    assert log.read_text() == "step,train/loss\n2,1\n10,1\n"  # branch 1's log, as it stood


def test_after_a_rollback_the_best_is_the_best_kept_validation_up_to_the_step(tmp_path) -> None:
    """Back to step 4 (no validation of its own), the best restarted at the next validation,
    step 6's 242.1, though step 3's 239.1 was better and on disk (probe 50)."""
    for step in (3, 4, 6):
        write_last(tmp_path, step)
        keep_step(tmp_path, step, keep=-1)
    log = tmp_path / "metrics.csv"
    log.write_text("step,train/loss,val/ppl\n0,,241.6\n3,,239.1\n3,2.0,\n6,,242.1\n")
    (tmp_path / "step-6.ckpt").unlink()  # set aside with the branch left
    assert best_before(tmp_path, "val/ppl", log, 4, {}) == (3, 239.1, tmp_path / "step-3.ckpt")
    mine = best_before(tmp_path, "val/ppl", log, 4, {"val/ppl": 238.0})  # its own, better
    assert mine == (4, 238.0, tmp_path / "last.ckpt")
    assert best_before(tmp_path, "val/ppl", None, 4, {}) is None


def test_bad_settings_name_the_key_and_a_value(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"checkpoint.keep=-2: .* 0 none, -1 every one; e.g. 3"):
        LastCheckpoint(str(tmp_path), keep=-2)
    with pytest.raises(ValueError, match=r"checkpoint.best='ppl': .*; e.g. val/ppl"):
        LastCheckpoint(str(tmp_path), best="ppl")


class InPlaceIO(TorchCheckpointIO):
    """A checkpoint IO that writes over the file itself (the same inode), as one may."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, path)


def fit(
    tmp_path, teacher, corpus, max_steps: int, ckpt_path: Path | None = None, safe: bool = True
) -> None:
    saver = LastCheckpoint(str(tmp_path / "checkpoints"), every=1, keep=-1, best="val/ppl")
    plugins = [SafeCheckpointIO() if safe else InPlaceIO()]
    options = {"limit_val_batches": 1, "plugins": plugins, "val_check_interval": 2}
    logger = ResumableCSVLogger(tmp_path, name="logs", version="")
    trainer = make_trainer(
        tmp_path, callbacks=[saver], max_steps=max_steps, logger=logger, **options
    )
    trainer.fit(make_module(teacher), make_datamodule([corpus]), ckpt_path=ckpt_path)


def validations(logs: Path) -> dict[int, float]:
    with open(logs / "metrics.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("val/ppl")]
    return {int(row["step"]): float(row["val/ppl"]) for row in rows}


def test_a_run_keeps_each_step_and_its_best_and_rolls_back(tiny_teacher, corpus, tmp_path) -> None:
    fit(tmp_path, tiny_teacher, corpus, max_steps=6)
    checkpoints = tmp_path / "checkpoints"
    assert list(kept_steps(checkpoints)) == [1, 2, 3, 4, 5, 6]
    best = json.loads((checkpoints / "best.json").read_text())
    logged = validations(tmp_path / "logs")
    assert best["step"] == min(logged, key=logged.get) and best["value"] == pytest.approx(
        min(logged.values())
    )
    assert torch.load(checkpoints / "best.ckpt", weights_only=False)["global_step"] == best["step"]

    fit(tmp_path, tiny_teacher, corpus, max_steps=6, ckpt_path=checkpoints / "step-4.ckpt")
    aside = checkpoints / "abandoned-after-step-4"
    assert {"last.ckpt", "step-5.ckpt", "step-6.ckpt"} <= {p.name for p in aside.iterdir()}
    assert validations(aside) == logged  # the abandoned steps' log, as it stood
    assert torch.load(checkpoints / "last.ckpt", weights_only=False)["global_step"] == 6
    assert list(kept_steps(checkpoints)) == [1, 2, 3, 4, 5, 6]
    after = json.loads((checkpoints / "best.json").read_text())
    if best["step"] > 4:  # set aside: the best starts again at the step rolled back to
        again = validations(tmp_path / "logs")
        assert after["step"] == min((4, 6), key=again.get)
    else:
        assert after == best


def test_a_rollback_under_a_checkpoint_io_that_writes_in_place_keeps_copies(
    tiny_teacher, corpus, tmp_path
) -> None:
    """The rollback made last.ckpt a hard link to the step it went back to whatever the
    checkpoint IO: one that rewrites last.ckpt in place rewrote that step's file with it."""
    fit(tmp_path, tiny_teacher, corpus, max_steps=4, safe=False)
    checkpoints = tmp_path / "checkpoints"
    fit(
        tmp_path,
        tiny_teacher,
        corpus,
        max_steps=4,
        ckpt_path=checkpoints / "step-2.ckpt",
        safe=False,
    )
    step_two = torch.load(checkpoints / "step-2.ckpt", weights_only=False)
    assert step_two["global_step"] == 2
    assert not (checkpoints / "last.ckpt").samefile(checkpoints / "step-2.ckpt")
