"""``launch/build.py``: a composed config built into the module, data module and trainer that
``lightning-kd train`` runs, from Python as from the command."""

from __future__ import annotations

from lightning_kd.launch.build import build, with_precision
from lightning_kd.launch.config import compose_config


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
