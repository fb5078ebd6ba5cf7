"""A run's length and validation interval: values each fine on their own, no run together."""

from __future__ import annotations

from lightning_kd.launch.checks import config_errors


def test_a_run_without_an_end_is_refused() -> None:
    """``trainer.max_steps=-1`` without ``max_epochs``: Lightning's 1,000 epochs (a smoke run was
    at step 5,247 after ten minutes, its cosine schedule stretched over all of them)."""
    (error,) = config_errors({"trainer": {"max_steps": -1, "max_epochs": None}})
    assert error == (
        "trainer.max_steps=-1 and trainer.max_epochs=null set no end to the run (Lightning "
        "would train 1,000 epochs); give trainer.max_steps (e.g. 140) or trainer.max_epochs "
        "(e.g. 1)"
    )
    (forever,) = config_errors({"trainer": {"max_steps": -1, "max_epochs": -1}})
    assert "(Lightning would train without end)" in forever
    assert config_errors({"trainer": {"max_steps": -1, "max_epochs": 2}}) == []
    assert config_errors({"trainer": {"max_steps": 10, "max_epochs": None}}) == []


def test_a_validation_interval_in_epochs_is_refused() -> None:
    """Runs count steps (``check_val_every_n_epoch=null``): Lightning refused a fraction naming
    that setting, which the user never made."""
    trainer = {"val_check_interval": 0.5, "check_val_every_n_epoch": None}
    (error,) = config_errors({"trainer": trainer})
    assert error.startswith("trainer.val_check_interval=0.5 is a fraction of an epoch")
    assert "give a step count, e.g. trainer.val_check_interval=50" in error
    assert config_errors({"trainer": {**trainer, "check_val_every_n_epoch": 1}}) == []
    assert config_errors({"trainer": {**trainer, "val_check_interval": 50}}) == []
