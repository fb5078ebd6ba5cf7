"""``DistillConfig``'s checks: a bad value is refused as the config is built, naming the key."""

import math

import pytest

from lightning_kd.distill.objective import DistillConfig


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"temperature": math.nan}, r"distill.temperature=nan: give a finite number \(default 1"),
        ({"kd_weight": math.inf}, r"distill.kd_weight=inf: give a finite number"),
        ({"ce_weight": -math.inf}, r"distill.ce_weight=-inf"),
        ({"blockwise_lr": math.nan}, r"distill.blockwise_lr=nan"),
        ({"temperature": 0.0}, r"distill.temperature=0.0; it must be >= 0.01 \(below, the KD"),
        ({"temperature": 1e-30}, r"distill.temperature=1e-30; it must be >= 0.01"),
        ({"kd_weight": -0.5}, r"distill.kd_weight=-0.5: must be >= 0"),
        ({"kd_weight": 0.0, "ce_weight": 0.0}, r"nothing would train"),
    ],
)
def test_a_bad_number_is_refused_naming_its_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        DistillConfig(**overrides)


def test_the_defaults_build():
    config = DistillConfig()
    assert config.kd_weight == 0.5 and config.uses_teacher_in_training


def test_the_command_and_the_config_share_the_least_temperature() -> None:
    from lightning_kd.distill.objective import MIN_TEMPERATURE
    from lightning_kd.launch.checks import RULES

    assert RULES["distill.temperature"].low == RULES["cache.temperature"].low == MIN_TEMPERATURE
