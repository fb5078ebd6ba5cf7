"""``launch/build.py``: a composed config built into the module, data module and trainer that
``lightning-kd train`` runs, from Python as from the command."""

from __future__ import annotations

import pytest

from lightning_kd.launch.build import build, logged_steps, with_precision
from lightning_kd.launch.config import compose_config
from lightning_kd.utils.compat import StepIntervalLoop


def test_a_config_left_auto_builds_with_the_precision_train_would_choose(tmp_path, capsys):
    """The Python API's compose_config then build, with the default trainer.precision=auto
    and teacher.dtype=auto: Lightning refused "Precision 'auto' is invalid" in a Hydra
    traceback; the precision is chosen for this machine, as the command chooses it."""
    cfg = compose_config(
        ["debug=smoke", "trainer.precision=auto", "teacher.dtype=auto"], output_dir=tmp_path
    )
    module, _, trainer, _ = build(cfg)
    _, choice = with_precision(cfg, announce=False)
    assert trainer.precision == choice.precision != "auto"
    assert module.teacher_spec.dtype == choice.teacher_dtype != "auto"
    assert choice.line() in capsys.readouterr().out, "the choice is said, as train says it"


def test_the_validation_interval_counts_optimizer_steps_with_accumulation(tmp_path) -> None:
    """The configs give trainer.val_check_interval in steps, Lightning counts batches: with 4
    batches a step, 2 steps are 8 batches (taken as 2 batches, a 6-step run validated inside
    every window, 12 times, and early stopping counted the repeats)."""
    overrides = ["debug=smoke", "trainer.val_check_interval=2", "trainer.max_steps=6"]
    for accumulate, batches in ((1, 2), (4, 8)):
        more = [f"trainer.accumulate_grad_batches={accumulate}"]
        _, _, trainer, _ = build(compose_config(overrides + more, output_dir=tmp_path))
        assert trainer.val_check_interval == batches
        # ... and counted as steps: batches drifted into windows after a partial one (probe 47)
        assert isinstance(trainer.fit_loop.epoch_loop, StepIntervalLoop) == (accumulate > 1)
    _, _, trainer, _ = build(  # a fraction of an epoch (a Trainer of one's own) is left as it is
        compose_config(
            [
                *overrides,
                "trainer.accumulate_grad_batches=4",
                "trainer.val_check_interval=0.5",
                "trainer.check_val_every_n_epoch=1",
            ],
            output_dir=tmp_path,
        )
    )
    assert trainer.val_check_interval == 0.5
    # Bounded by epochs: counted over the run too, not on each epoch's grid (probe 50: steps 3,
    # 7, 11 for every 3, and Lightning's traceback for an interval longer than an epoch)
    epochs = ["trainer.max_steps=-1", "trainer.max_epochs=2", "trainer.accumulate_grad_batches=2"]
    config = compose_config([*overrides[:2], *epochs], output_dir=tmp_path)
    _, _, trainer, _ = build(config)
    assert trainer.check_val_every_n_epoch is None and trainer.val_check_interval == 4
    assert isinstance(trainer.fit_loop.epoch_loop, StepIntervalLoop)


def test_a_config_composed_without_its_run_directory_is_told_how_to_give_it() -> None:
    """It failed with OmegaConf's "HydraConfig was not set", naming neither key nor fix."""
    with pytest.raises(ValueError, match=r"compose_config\(overrides, output_dir=DIR\)"):
        build(compose_config(["debug=smoke"]))


def test_a_run_shorter_than_the_logging_interval_logs_its_losses() -> None:
    """trainer.max_steps=4 at the default log_every_n_steps=5 logged no training loss at all."""
    short = compose_config(["trainer.max_steps=4"], output_dir="/tmp/unused")  # logs every 5
    assert logged_steps(short) == {"log_every_n_steps": 4}
    assert logged_steps(compose_config(["trainer.max_steps=40"])) == {}
    assert logged_steps(compose_config(["trainer.max_steps=-1", "trainer.max_epochs=1"])) == {}
