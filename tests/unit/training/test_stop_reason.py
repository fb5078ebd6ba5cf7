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
