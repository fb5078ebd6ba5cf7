"""``training/mlflow_log.py``: a run stopped to be resumed is KILLED in MLflow, not FAILED."""

from __future__ import annotations

import signal
from pathlib import Path

from lightning_kd.training.mlflow_log import MLflowRunLogger
from lightning_kd.utils.stopping import Interrupted


def ended(tmp_path: Path, error: BaseException) -> str:
    """The MLflow status of a run whose fit ended with ``error``, finalized as Lightning does:
    ``finalize("failed")`` inside its handler of the exception."""
    from mlflow.tracking import MlflowClient  # a dev dependency: never skipped

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = MLflowRunLogger(experiment_name="kd", tracking_uri=uri, save_dir=None)
    logger.log_metrics({"train/loss": 1.0}, step=0)
    try:
        raise error
    except BaseException:
        logger.finalize("failed")
    return MlflowClient(uri).get_run(logger.run_id).info.status


def test_a_run_a_signal_stopped_is_killed_and_a_crash_failed(tmp_path: Path) -> None:
    stopped = Interrupted(signal.SIGTERM, "after optimizer step 15", "saved last.ckpt")
    assert ended(tmp_path / "stopped", stopped) == "KILLED"
    assert ended(tmp_path / "crashed", RuntimeError("out of memory")) == "FAILED"
