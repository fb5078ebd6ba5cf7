"""``lightning_kd.train`` claims its run directory as the command does."""

from __future__ import annotations

import pytest

import lightning_kd
from lightning_kd.launch.config import compose_config
from lightning_kd.training.rundir import RunDirError


def test_a_second_call_into_a_finished_runs_directory_is_refused(tmp_path, monkeypatch) -> None:
    """A notebook cell run twice trained again into the finished run's directory: its
    checkpoint, student and summary replaced, a second run's rows appended to its log
    (probe 58). Resumed (ckpt_path=last) or overwrite=true, it runs."""
    calls = []

    def trained(cfg, ckpt_path, command):
        calls.append(ckpt_path)
        (tmp_path / "checkpoints").mkdir(exist_ok=True)
        (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
        (tmp_path / "summary.json").write_text("{}")

    monkeypatch.setattr("lightning_kd.launch.run_from_python.train_run", trained)
    cfg = compose_config(["debug=smoke"], output_dir=str(tmp_path))
    lightning_kd.train(cfg)
    refused = r"already holds a run's outputs .*another directory \(output_dir=\.\.\. of compose"
    with pytest.raises(RunDirError, match=refused):
        lightning_kd.train(cfg)
    assert len(calls) == 1
    overwrite = compose_config(["debug=smoke", "overwrite=true"], output_dir=str(tmp_path))
    lightning_kd.train(overwrite)
    assert len(calls) == 2
