"""What a refused launch leaves in its run directory (``cli/refused_run_dir.py``)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from lightning_kd.cli import refused_run_dir
from lightning_kd.cli.refused_run_dir import drop_own_record
from lightning_kd.training.rundir import LOCK_NAME
from lightning_kd.utils.locks import take_lock


def recorded(directory) -> None:
    """A launch's record: Hydra's ``.hydra`` and the run's lock."""
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "config.yaml").write_text("seed: 1")
    (directory / LOCK_NAME).write_text("")


def test_a_launch_refused_for_a_held_directory_leaves_the_holders_record(
    tmp_path, monkeypatch
) -> None:
    """Two launches at once into one directory: the refused one removed the winner's .lock and
    .hydra (made a moment before, so taken for its own), and a third launch then ran beside the
    first (probe 48)."""
    monkeypatch.setattr(
        refused_run_dir.HydraConfig, "get", lambda: SimpleNamespace(job=SimpleNamespace(name="t"))
    )
    since = time.time()
    recorded(tmp_path)
    holder = take_lock(tmp_path / LOCK_NAME)  # the winner, training
    try:
        drop_own_record(tmp_path, since)
        assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", LOCK_NAME]
    finally:
        os.close(holder)
    drop_own_record(tmp_path, since)  # nobody holds it: the refused launch's own, removed
    assert list(tmp_path.iterdir()) == []


def test_a_launch_refused_for_a_held_directory_is_not_told_to_overwrite_it(
    tmp_path, monkeypatch
) -> None:
    """The holder's fresh logs were taken for the refused launch's own, and the refusal said to
    rerun with overwrite=true: which deletes the other run's outputs (probe 52)."""
    monkeypatch.setattr(refused_run_dir, "run_directory", lambda: tmp_path)
    since = time.time()
    recorded(tmp_path)
    (tmp_path / "logs").mkdir()  # written by the run training there, since the launch began
    (tmp_path / "logs" / "metrics.csv").write_text("step\n")
    holder = take_lock(tmp_path / LOCK_NAME)
    try:
        assert refused_run_dir.started_outputs(since) == ""
    finally:
        os.close(holder)
    # Nobody holds it: the outputs are the refused launch's own, and the advice stands.
    assert "overwrite=true" in refused_run_dir.started_outputs(since)
