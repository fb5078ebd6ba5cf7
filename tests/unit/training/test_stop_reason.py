"""What ended training before ``trainer.max_steps`` (``training/stop_reason.py``)."""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import Timer

from lightning_kd.training.stop_reason import stop_reason


def test_a_run_max_time_ended_is_said_unfinished() -> None:
    """It ended as a finished one, exit 0, stopped_early null (probe 47)."""
    timer = Timer(duration="00:00:01:00")
    timer.load_state_dict({"time_elapsed": {"train": 61.0}})
    trainer = SimpleNamespace(
        early_stopping_callbacks=[], callbacks=[timer], global_step=40, max_steps=200
    )
    kind, reason = stop_reason(trainer)
    assert kind == "max_time"
    assert reason.startswith("trainer.max_time reached after 0:01:01 of training")
    assert "(optimizer step 40 of 200): the run is unfinished; ckpt_path=last" in reason
    assert stop_reason(SimpleNamespace(**vars(trainer) | {"global_step": 200})) == (None, None)
    timer.load_state_dict({"time_elapsed": {"train": 30.0}})
    assert stop_reason(trainer) == (None, None)  # time left: ended at max_steps


def test_a_resume_past_a_decided_early_stop_stops_at_once() -> None:
    """A signal in the step whose validation spent the patience: the resume trained 3 steps
    more, to the next validation (probe 47)."""
    import torch
    from lightning.pytorch.callbacks import EarlyStopping

    from lightning_kd.training.stop_reason import DecidedStop

    stopping = EarlyStopping(monitor="val/ppl", patience=1)
    stopping.load_state_dict(
        {"wait_count": 1, "stopped_epoch": 0, "best_score": torch.tensor(239.278), "patience": 1}
    )
    trainer = SimpleNamespace(
        early_stopping_callbacks=[stopping],
        callbacks=[stopping],
        global_step=6,
        max_steps=30,
        should_stop=False,
    )
    DecidedStop().on_train_start(trainer, None)
    assert trainer.should_stop
    assert stop_reason(trainer) == (
        "early_stopping",
        "Monitored metric val/ppl did not improve in the last 1 records. Best score: 239.278. "
        "(optimizer step 6 of 30)",
    )
    fresh = SimpleNamespace(**vars(trainer) | {"should_stop": False})
    stopping.wait_count = 0  # patience left: trains on
    DecidedStop().on_train_start(fresh, None)
    assert not fresh.should_stop
