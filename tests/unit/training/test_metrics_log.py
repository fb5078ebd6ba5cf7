"""metrics.csv across resumes: appended to, trimmed to the checkpoint, widened whole."""

from __future__ import annotations

import csv
import errno
import os
from pathlib import Path

import pytest

from lightning_kd.training import metrics_log
from lightning_kd.training.metrics_log import ResumableCSVLogger


def test_a_resume_keeps_the_validation_its_checkpoint_records(tmp_path: Path) -> None:
    """A validation after step 4 is logged at 4, beside step 5's training row (also at 4): a
    resume from step 4 logs the training row again, and the validation only if not recorded."""
    for validated, kept in ((True, ["val/ppl"]), (False, [])):
        first = ResumableCSVLogger(tmp_path / str(validated), name="logs", version="")
        first.log_metrics({"train/loss": 3.0}, step=3)
        first.log_metrics({"val/ppl": 9.0}, step=4)
        first.log_metrics({"train/loss": 4.0}, step=4)
        first.save()
        ResumableCSVLogger(tmp_path / str(validated), name="logs", version="").drop_rows_from(
            4, validated
        )
        with open(tmp_path / str(validated) / "logs" / "metrics.csv") as handle:
            rows = list(csv.DictReader(handle))
        at_four = [name for row in rows if row["step"] == "4" for name, v in row.items() if v]
        assert [row["step"] for row in rows if row["train/loss"]] == ["3"]
        assert [name for name in at_four if name != "step"] == kept


def test_the_csv_logger_appends_and_drops_rows_a_resume_logs_again(tmp_path: Path) -> None:
    first = ResumableCSVLogger(tmp_path, name="logs", version="")
    for step in range(6):
        first.log_metrics({"train/loss": float(step)}, step=step)
    first.save()
    second = ResumableCSVLogger(tmp_path, name="logs", version="")
    second.drop_rows_from(4)
    second.log_metrics({"train/loss": 40.0, "val/ppl": 9.0}, step=4)
    second.save()
    with open(tmp_path / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["step"], r["train/loss"]) for r in rows] == [
        ("0", "0.0"),
        ("1", "1.0"),
        ("2", "2.0"),
        ("3", "3.0"),
        ("4", "40.0"),
    ]
    assert rows[-1]["val/ppl"] == "9.0"


def test_a_full_disk_keeps_the_earlier_hparams_yaml(tmp_path: Path, monkeypatch) -> None:
    first = ResumableCSVLogger(tmp_path, name="logs", version="")
    first.log_hyperparams({"lr": 0.001})
    hparams = Path(first.log_dir) / "hparams.yaml"
    before = hparams.read_text()
    assert "lr: 0.001" in before

    def full_disk(path, params) -> None:  # Lightning's writer: opens, truncates, runs out
        with open(path, "w") as handle:
            handle.write("lr: 0.0")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metrics_log, "save_hparams_to_yaml", full_disk)
    resumed = ResumableCSVLogger(tmp_path, name="logs", version="")
    with pytest.raises(OSError, match=f"no space left on {hparams}: free space and resume"):
        resumed.log_hyperparams({"lr": 0.002})
    assert hparams.read_text() == before
    assert sorted(p.name for p in hparams.parent.iterdir()) == ["hparams.yaml"]


def test_a_zero_filled_log_is_set_aside_not_appended_to(tmp_path: Path, capsys) -> None:
    """A crash can leave metrics.csv full of NUL bytes: a resume appended its rows under a
    header of 45,480 NULs and one more column on every row (probe 23)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.csv").write_bytes(b"\0" * 500)
    logger = ResumableCSVLogger(tmp_path, name="logs", version="")
    logger.drop_rows_from(4)
    logger.log_metrics({"train/loss": 1.0}, step=4)
    logger.save()
    with open(logs / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [{"step": "4", "train/loss": "1.0"}]
    (aside,) = logs.glob("metrics.csv.unreadable-*")
    assert aside.read_bytes() == b"\0" * 500  # kept, never removed
    assert f"moved to {aside}, a new one begins" in capsys.readouterr().out


def test_a_log_saved_again_by_a_spreadsheet_is_read_as_it_was_meant(tmp_path: Path) -> None:
    """A step of "1.0" (pandas, a spreadsheet) stopped the resume with a raw ValueError, blamed
    on training, the file not named (probe 23)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.csv").write_text("step,train/loss\n0.0,1\n1.0,2\n5.0,3\nabc,4\n")
    ResumableCSVLogger(tmp_path, name="logs", version="").drop_rows_from(4)
    with open(logs / "metrics.csv", newline="") as handle:
        assert [row["step"] for row in csv.DictReader(handle)] == ["0.0", "1.0", "abc"]


def test_a_full_disk_while_a_resume_trims_the_log_names_it_and_keeps_it(
    tmp_path: Path, monkeypatch
) -> None:
    """It said "No space left on device" naming no file, and left metrics.csv.partial beside
    the log (probe 47)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.csv").write_text("step,train/loss\n0,1\n5,3\n")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(
        OSError, match=rf"no space left on {logs}/metrics.csv: free space and resume"
    ):
        ResumableCSVLogger(tmp_path, name="logs", version="").drop_rows_from(4)
    assert (logs / "metrics.csv").read_text() == "step,train/loss\n0,1\n5,3\n"
    assert sorted(p.name for p in logs.iterdir()) == ["metrics.csv"]


def test_a_metric_logged_for_the_first_time_widens_the_log_whole(
    tmp_path: Path, monkeypatch
) -> None:
    """Lightning truncated metrics.csv and wrote every row again in place when a new column
    appeared (a callback added on a resume, lm-eval scores at the end): a full disk or a kill
    then lost the run's log (probe 47)."""
    logger = ResumableCSVLogger(tmp_path, name="logs", version="")
    for step in range(3):
        logger.log_metrics({"train/loss": float(step)}, step=step)
    logger.save()
    path = tmp_path / "logs" / "metrics.csv"
    before = path.read_text()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", no_space)
        with pytest.raises(OSError, match=rf"no space left on {path}: free space and resume"):
            logger.log_metrics({"train/loss": 3.0, "val/ppl": 9.0}, step=3)  # saved each step
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.csv"]

    logger.log_metrics({"train/loss": 4.0, "val/ppl": 8.0}, step=4)  # space again
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["step"], row["train/loss"], row["val/ppl"]) for row in rows] == [
        ("0", "0.0", ""),
        ("1", "1.0", ""),
        ("2", "2.0", ""),
        ("3", "3.0", "9.0"),  # kept in memory when its save failed
        ("4", "4.0", "8.0"),
    ]
