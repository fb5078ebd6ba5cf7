"""The model settings of ``train`` refused with the config, before any model loads (each was a
traceback once the teacher had loaded)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.model_checks import model_setting_errors

PAIR = "{student: model.layers.0, teacher: model.layers.1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("distill.features=unifrom", "distill.features='unifrom': did you mean 'uniform'?"),
        (f"distill.features=[{PAIR}, wieght: 2}}]", "takes no key 'wieght'; did you mean weight?"),
        (f"distill.features=[{PAIR}, loss: kl}}]", "distill.features[0]: unknown feature loss"),
        (f"distill.features=[{PAIR}, weight: -1}}]", "weight must be >= 0"),
        ("distill.feature_loss=bogus", "distill.feature_loss / feature_weight: unknown feature"),
        ("distill.projector=bogus", "distill.projector='bogus': choose one of ['linear', 'none']"),
        ("student.num_layers=5", "student.num_layers=5 is larger than the teacher's 4 layers"),
        ("student.layers=[0,9]", "student.layers has indices [9] outside the teacher's 0..3"),
        ("student.freeze_layers=2", "student.freeze_layers=2 would freeze all 2 of the student"),
        ("student.layers=imp", "give teacher layer indices ([0,15,29]) or 'importance'"),
        ("student.lora={r: 0}", "student.lora.r=0: an integer >= 1"),
        ("student.config={hidden_sise: 32}", "did you mean student.config.hidden_size?"),
        ("+teacher.config.n_layers=2", "teacher.config.n_layers: a llama config has no key"),
    ],
)
def test_a_model_setting_the_run_would_refuse_is_refused_with_the_config(override, message):
    errors = model_setting_errors(compose_config(["debug=smoke", override]))
    assert len(errors) == 1 and message in errors[0], errors


def test_the_shipped_configs_pass() -> None:
    for overrides in ([], ["debug=smoke"], ["debug=smoke", "student.layers=importance"]):
        assert model_setting_errors(compose_config(overrides)) == []
