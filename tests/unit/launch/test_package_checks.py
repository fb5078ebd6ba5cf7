"""An optional package a config needs (peft for ``student.lora``, torchao for an int8 teacher) is
refused before anything loads, naming the extra that installs it — the advice a wheel user can
follow. Absence is simulated by hiding the package from ``find_spec``."""

from __future__ import annotations

import pytest

from lightning_kd.cli import main
from lightning_kd.launch import auto
from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.models import lora, quantize

LORA = (
    "student.lora needs the peft package, which is not installed: "
    "pip install 'lightning-kd[lora]' (or set student.lora=null)"
)
INT8 = (
    "teacher.quantize=int8 needs the torchao package, which is not installed: "
    "pip install 'lightning-kd[quantize]' (or set teacher.quantize=null)"
)


@pytest.fixture
def without_extras(monkeypatch) -> None:
    """peft and torchao as an install without the ``lora`` and ``quantize`` extras sees them."""
    monkeypatch.setattr(lora, "find_spec", lambda name: None)
    monkeypatch.setattr(quantize, "find_spec", lambda name: None)


def test_the_config_check_names_each_missing_extra(without_extras) -> None:
    errors = config_errors(
        compose_config(["debug=smoke", "student.lora={r: 4}", "teacher.quantize=int8"])
    )
    assert LORA in errors and INT8 in errors
    assert config_errors(compose_config(["debug=smoke"])) == []  # neither asked for
    teachers = "teachers=[{name: a, weight: 0.5}, {name: b, weight: 0.5, quantize: int8}]"
    assert f"teachers[1]: {INT8}" in config_errors(compose_config(["debug=smoke", teachers]))


@pytest.mark.parametrize(
    "override, message", [("student.lora={r: 4}", LORA), ("teacher.quantize=int8", INT8)]
)
def test_train_refuses_a_missing_extra_with_exit_2(
    without_extras, override, message, tmp_path, capsys, monkeypatch
) -> None:
    def read_data(*args, **kwargs):
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(auto, "build_datamodule", read_data)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as leaving:
        main(["train", "debug=smoke", override, f"hydra.run.dir={run_dir}"])
    assert leaving.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
