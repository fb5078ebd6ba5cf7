"""The run's ``metrics.csv``, kept across resumes and never half-written.

:class:`ResumableCSVLogger` is Lightning's ``CSVLogger`` with three changes. It appends to an
existing ``metrics.csv``, dropping only the rows logged after the checkpoint a resume starts from
(the resumed run logs those steps again); Lightning deletes the file at start. It writes
``hparams.yaml`` whole. And where a metric appears for the first time (a callback added on a
resume, lm-eval scores at the end) it rewrites the log with the wider header through a temporary
file: Lightning truncates ``metrics.csv`` and writes every row again in place, so a full disk or a
kill at that moment lost the log of a run days long (probe 47).
"""

from __future__ import annotations

import csv
import io
import os
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from lightning_kd.training.checkpoints import RESUME
from lightning_kd.utils.atomic import atomic_write_bytes, replaced_whole
from lightning_kd.utils.disk import disk_errors


def set_aside_unreadable(path: Path) -> bool:
    """Move ``metrics.csv`` aside (beside it, never removed) where it is no CSV this logger
    wrote (a crash left it zero-filled, or another program wrote it): a resume appended its rows
    under a header of NUL bytes. Whether it was moved."""
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        first = handle.readline(1 << 16)
    header = first.decode("utf-8", errors="replace").strip().split(",")
    if not first or (b"\0" not in first and "step" in header):
        return False
    aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(path, aside)
    print(f"{path} is not a metrics file this logger wrote; moved to {aside}, a new one begins")
    return True


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, minus deleting an existing ``metrics.csv`` at start, and with
    ``hparams.yaml`` and a widened ``metrics.csv`` replaced whole rather than rewritten in
    place."""

    def _check_log_dir_exists(self) -> None:
        set_aside_unreadable(Path(self.metrics_file_path))
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="") as handle:
                self.metrics_keys = sorted(csv.DictReader(handle).fieldnames or [])

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Record ``params`` and write ``hparams.yaml`` through a temporary file: Lightning
        truncates it first, so a full disk at a resume left an empty file where the run's
        hyper-parameters were."""
        self.hparams.update(params)
        path = Path(self.log_dir) / self.NAME_HPARAMS_FILE
        with replaced_whole(path) as temp, disk_errors(path, RESUME):
            save_hparams_to_yaml(temp, self.hparams)

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        """``metrics.csv`` again under ``fieldnames`` (a metric logged for the first time),
        written beside it and renamed over it: the old log stays whole until the new one is."""
        path = Path(self.metrics_file_path)
        written, rows = read_rows(path)
        try:
            write_rows(path, fieldnames, rows, RESUME)
        except BaseException:
            # Lightning counted the new keys as written: the next save would append rows of
            # the wider header under the old one. As the file stands, it widens it again.
            self.metrics_keys = sorted(written)
            raise


class ResumableCSVLogger(CSVLogger):
    """A CSV logger that keeps earlier rows of ``metrics.csv`` and flushes every step."""

    def __init__(self, *args, flush_logs_every_n_steps: int = 1, **kwargs) -> None:
        super().__init__(*args, flush_logs_every_n_steps=flush_logs_every_n_steps, **kwargs)

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    def drop_rows_from(self, step: int, validated: bool = False) -> None:
        """Remove rows logged at ``step`` or later: a resume from step ``step`` logs them again;
        if ``validated``, that step's validation (which its checkpoint records) is kept."""
        path = Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE
        if not path.is_file() or set_aside_unreadable(path):
            return
        fields, rows = read_rows(path)
        kept = [row for row in rows if not row.get("step") or kept_row(row, step, validated)]
        write_rows(path, fields, kept, "resume with ckpt_path=last")


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of the CSV file ``path``."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
    return list(reader.fieldnames or []), rows


def write_rows(path: Path, fields: list[str], rows: list[dict[str, str]], then: str) -> None:
    """``path`` written as the CSV of ``fields`` and ``rows``, whole or not at all: a full disk
    named with ``then``, the way on, and nothing left beside it (a visible
    ``metrics.csv.partial`` and a message naming no file; probe 47)."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_bytes(path, text.getvalue().encode(), then)


def kept_row(row: dict[str, str], step: int, validated: bool) -> bool:
    """Whether a resume from ``step`` keeps ``row`` of metrics.csv: one logged before it, or its
    validation, which a validation after the step's optimizer update logs at ``step`` itself."""
    try:  # "1.0" where a spreadsheet or pandas saved the file again
        logged = float(row["step"])
    except ValueError:  # no number: kept, as a row without a step is
        return True
    validation = any(value for name, value in row.items() if name.startswith("val/"))
    return logged < step or (logged == step and validated and validation)
