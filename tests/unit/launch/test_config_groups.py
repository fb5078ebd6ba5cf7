"""The swappable parts chosen by name: logger=, optimizer=, scheduler=, +callbacks=.

One smoke run carries every optional logger and callback at once (mlflow and wandb alone take
seconds to import); each test then reads what its part wrote.
"""

from __future__ import annotations

import csv
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lightning_kd.launch import logger_checks
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import register_defaults
from lightning_kd.training.optim import decay_groups
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A smoke run with all four loggers and the named callbacks; early stopping ends it at the
    second validation (an improvement of 1000 in perplexity is asked for)."""
    run_dir = tmp_path_factory.mktemp("groups") / "run"
    result = subprocess.run(
        [
            sys.executable,
            "run.py",
            "debug=smoke",
            "logger=[csv,tensorboard,mlflow,wandb]",
            "+callbacks=[early_stopping,device_stats,rich_progress]",
            "callbacks.early_stopping.min_delta=1000",
            "callbacks.early_stopping.patience=1",
            "trainer.val_check_interval=2",
            "validate_before=false",
            "export_student=false",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir / "stdout.txt").write_text(result.stdout)
    return run_dir


@pytest.mark.integration  # reads the smoke run's directory (a subprocess)
def test_csv_logger_writes_metrics_csv(run_dir: Path) -> None:
    with open(run_dir / "logs" / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert any(row.get("train/loss") for row in rows)
    assert any(row.get("val/ppl") for row in rows)


@pytest.mark.integration  # reads the smoke run's directory (a subprocess)
def test_tensorboard_logger_writes_event_files(run_dir: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run_dir / "logs").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert {"train/loss", "val/ppl"} <= set(accumulator.Tags()["scalars"])


@pytest.mark.integration  # reads the smoke run's directory (a subprocess)
def test_mlflow_logger_writes_a_local_store(run_dir: Path) -> None:
    with sqlite3.connect(run_dir / "logs" / "mlflow.db") as db:
        keys = {key for (key,) in db.execute("select key from metrics")}
        statuses = [status for (status,) in db.execute("select status from runs")]
    assert {"train/loss", "val/ppl"} <= keys
    assert statuses == ["FINISHED"]
    assert not (ROOT / "mlruns").exists(), "nothing lands in the working directory"


@pytest.mark.integration  # reads the smoke run's directory (a subprocess)
def test_wandb_logger_writes_an_offline_run(run_dir: Path) -> None:
    (offline,) = (run_dir / "logs" / "wandb").glob("offline-run-*")
    (records,) = offline.glob("run-*.wandb")
    data = records.read_bytes()
    assert b"train/loss" in data and b"val/ppl" in data
    assert not (ROOT / "wandb").exists(), "nothing lands in the working directory"


@pytest.mark.integration  # reads the smoke run's directory (a subprocess)
def test_named_callbacks_run(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4  # early stopping: no improvement at the validation of step 4
    # said in the summary (the run ended as a finished one, without a word)
    assert summary["stopped_early"].startswith("Monitored metric val/ppl did not improve in the")
    assert summary["stopped_early"].endswith("(optimizer step 4 of 6)")
    assert summary["stopped_by"] == "early_stopping"  # finished: a resume is refused
    assert "| stopped early |  | Monitored metric val/ppl" in (run_dir / "stdout.txt").read_text()
    with open(run_dir / "logs" / "metrics.csv") as handle:
        header = next(csv.reader(handle))
    assert any("cpu_percent" in name for name in header)  # device_stats
    stdout = (run_dir / "stdout.txt").read_text()
    assert "━" in stdout and "it/s]" not in stdout  # rich's bar, not tqdm's


@pytest.fixture(scope="module")
def hydra_conf():
    register_defaults()  # the groups' defaults, as run.py registers them
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        yield


def compose_run(*overrides: str):
    return compose("config", overrides=["output_dir=/tmp/unused", *overrides])


def test_a_missing_logger_package_is_named_before_anything_loads(hydra_conf, monkeypatch) -> None:
    real = logger_checks.find_spec
    monkeypatch.setattr(
        logger_checks, "find_spec", lambda name: None if name == "mlflow" else real(name)
    )
    errors = config_errors(compose_run("logger=[csv,mlflow]"))
    assert errors == [
        "logger=mlflow (lightning_kd.training.mlflow_log.MLflowRunLogger) needs the mlflow "
        "package, which is not installed: pip install mlflow (or choose another logger, e.g. "
        "logger=csv)"
    ]
    assert config_errors(compose_run("logger=tensorboard")) == []


def test_no_logger_asks_to_remove_the_callbacks_that_need_one(hydra_conf) -> None:
    (error,) = config_errors(compose_run("~logger"))
    assert "callbacks.lr_monitor (StepLearningRates)" in error
    assert "'~callbacks.lr_monitor'" in error
    assert config_errors(compose_run("~logger", "~callbacks.lr_monitor")) == []


def test_adafactor_keeps_factored_state_and_follows_the_scheduler(hydra_conf) -> None:
    cfg = compose_run("optimizer=adafactor", "scheduler=constant")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    optimizer = instantiate(cfg.optimizer, _convert_="all")(decay_groups(model.parameters()))
    scheduler = instantiate(cfg.scheduler)(optimizer, total_steps=40)
    for _ in range(40):
        model(torch.randn(4, 8)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    state = optimizer.state[model[0].weight]
    assert set(state) >= {"exp_avg_sq_row", "exp_avg_sq_col"} and "exp_avg" not in state
    # constant: after the warmup (2 of 40 steps) the peak rate to the end
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optimizer.lr)


def test_scheduler_default_and_none(hydra_conf) -> None:
    assert compose_run().scheduler._target_ == "lightning_kd.training.optim.warmup_cosine"
    assert "scheduler" not in compose_run("~scheduler")


@pytest.mark.integration  # a smoke run (a subprocess)
def test_a_monitor_validation_lacks_is_refused_before_training_without_validate_before(
    tmp_path: Path,
) -> None:
    """No validation before training to check it on (validate_before=false, or a resume): the
    monitors are checked on one validation batch (Lightning's sanity check) before step 0. It
    failed at the first validation in training, and the resume it advised failed there again."""
    run_dir = tmp_path / "run"
    argv = [
        sys.executable,
        "run.py",
        "debug=smoke",
        "+callbacks=early_stopping",
        "callbacks.early_stopping.monitor=val/nosuch",
        "validate_before=false",
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "EarlyStopping monitors 'val/nosuch', which validation does not log" in result.stderr
    assert "'val/ppl'" in result.stderr  # the metrics it could monitor
    assert "Traceback" not in result.stderr
    assert "Resume with" not in result.stdout + result.stderr
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()
