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


def test_a_run_bounded_by_epochs_validates_each_epoch_by_default(tmp_path) -> None:
    """trainer.val_check_interval followed trainer.max_steps: -1 for a run of epochs, refused
    as a setting the user never made, and the fraction the message offered was refused too
    (probe 34)."""
    from lightning_kd.launch.build import build_trainer
    from lightning_kd.launch.config import compose_config

    epochs = ["trainer.max_steps=-1", "trainer.max_epochs=1", "trainer.precision=32-true"]
    cfg = compose_config(epochs, output_dir=tmp_path)
    assert (cfg.trainer.val_check_interval, cfg.trainer.check_val_every_n_epoch) == (None, 1)
    assert config_errors(cfg) == []
    trainer, _ = build_trainer(cfg)  # Lightning takes it
    assert trainer.check_val_every_n_epoch == 1
    half = compose_config([*epochs, "trainer.val_check_interval=0.5"], output_dir=tmp_path)
    assert config_errors(half) == [] and build_trainer(half)[0].val_check_interval == 0.5
    steps = compose_config([], output_dir=tmp_path)
    assert (steps.trainer.val_check_interval, steps.trainer.check_val_every_n_epoch) == (80, None)


def test_early_stopping_that_can_never_stop_the_run_is_said() -> None:
    """One validation in training gives patience nothing to count: it ran without a word
    (probe 47)."""
    from lightning_kd.launch.length_checks import early_stopping_note

    def cfg(steps: int, interval: int, patience: int | None = 3) -> dict:
        callbacks = {} if patience is None else {"early_stopping": {"patience": patience}}
        trainer = {"max_steps": steps, "val_check_interval": interval}
        return {"trainer": trainer, "callbacks": callbacks}

    note = early_stopping_note(cfg(12, 12))
    assert note.startswith("callbacks.early_stopping (patience=3) can never stop this run")
    assert "validates 1 time(s) in training" in note and "trainer.val_check_interval=2" in note
    assert early_stopping_note(cfg(12, 3)) is None  # 4 validations: patience 3 can stop it
    assert early_stopping_note(cfg(12, 12, patience=None)) is None
    assert early_stopping_note(cfg(-1, 12)) is None  # by epochs
