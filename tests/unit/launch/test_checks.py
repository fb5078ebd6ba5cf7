"""Every numeric config value is checked before anything loads."""

from __future__ import annotations

import math

import pytest

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.entry import check_entry


@pytest.fixture(scope="module")
def default_cfg():
    return compose_config(output_dir="/tmp/unused")


def test_the_shipped_configs_pass(default_cfg) -> None:
    assert config_errors(default_cfg) == []
    for extra in (
        ["debug=smoke"],
        ["experiment=minilm"],
        ["experiment=ce_only"],
        ["experiment=long"],
    ):
        cfg = compose_config(extra, output_dir="/tmp/unused")
        assert config_errors(cfg) == [], extra


BAD = {
    "optimizer.lr": (math.nan, "a finite number > 0"),
    "distill.temperature": (math.inf, "a finite number >= 0.01"),
    "distill.kd_weight": (math.nan, "a finite number >= 0"),
    "distill.ce_weight": (-1.0, "a finite number >= 0"),
    "distill.feature_weight": (math.nan, ">= 0"),
    "distill.beta": (1.5, "in [0, 1]"),
    "distill.skew": (1.0, "in [0, 1)"),
    "trainer.max_steps": (0, "an integer >= 1 (or -1)"),
    "trainer.accumulate_grad_batches": (0, "an integer >= 1"),
    "trainer.limit_val_batches": (0, "an integer >= 1 (batches) or a number in (0, 1]"),
    "trainer.val_check_interval": (1.5, "a number in (0, 1]"),
    "data.block_size": (1, "an integer >= 2"),
    "data.batch_size": (2.5, "an integer >= 1"),
    "data.val_fraction": (1.0, "in (0, 1)"),
    "checkpoint.every": (0, "an integer >= 1"),
    "checkpoint.keep": (-2, "an integer >= -1"),
    "checkpoint.best": ("ppl", "a validation metric, val/<name>"),
    "trainer.gradient_clip_val": ("big", "a finite number >= 0"),
}


@pytest.mark.parametrize("key", BAD)
def test_a_bad_value_names_key_value_range_and_fix(default_cfg, key: str) -> None:
    value, allowed = BAD[key]
    cfg = default_cfg.copy()
    section, name = key.split(".")
    cfg[section][name] = value
    with pytest.raises(ValueError) as error:
        check_entry(cfg)
    message = str(error.value)
    assert f"{key}={value!r}" in message and allowed in message, message
    assert f"e.g. {key}=" in message, message


def test_every_bad_value_is_reported_at_once(default_cfg) -> None:
    cfg = default_cfg.copy()
    cfg.optimizer.lr = -1.0
    cfg.trainer.devices = 0
    cfg.optimizer.betas = [0.9, 1.0]
    cfg.trainer.max_steps = True  # a boolean is not a step count
    errors = config_errors(cfg)
    # trainer.val_check_interval repeats trainer.max_steps (${trainer.max_steps}): named once
    assert len(errors) == 4, errors
    assert not any(e.startswith("trainer.val_check_interval") for e in errors)
    assert any(e.startswith("trainer.max_steps=True") for e in errors)
    assert any(e.startswith("trainer.devices=0") for e in errors)
    assert any(e.startswith("optimizer.betas=[0.9, 1.0]") for e in errors)


NOTHING_TO_LEARN = "are all 0: the loss would be 0.0 and nothing would train"


@pytest.mark.parametrize(
    ("features", "feature_weight", "refused"),
    [
        (None, 1.0, True),
        ("uniform", 0.0, True),
        ("uniform", 1.0, False),
        ([{"student": "model.norm", "teacher": "model.norm"}], 0.0, True),
        ([{"student": "model.norm", "teacher": "model.norm", "weight": 0.0}], 1.0, True),
        ([{"student": "model.norm", "teacher": "model.norm", "weight": 2.0}], 0.0, False),
    ],
)
def test_an_objective_whose_every_weight_is_0_is_refused(
    default_cfg, features, feature_weight: float, refused: bool
) -> None:
    cfg = default_cfg.copy()
    cfg.distill.kd_weight = cfg.distill.ce_weight = 0.0
    cfg.distill.features = features
    cfg.distill.feature_weight = feature_weight
    errors = [e for e in config_errors(cfg) if NOTHING_TO_LEARN in e]
    assert bool(errors) == refused, errors
    if refused:
        assert "e.g. distill.kd_weight=0.5" in errors[0]


def test_top_level_switches_take_booleans_and_known_modes(default_cfg) -> None:
    cfg = default_cfg.copy()
    cfg.overwrite, cfg.resume_reset_optimizer, cfg.resume_mismatch = 1, "yes", "ignore"
    errors = config_errors(cfg)
    assert "overwrite=1: use true or false" in errors
    assert "resume_reset_optimizer='yes': use true or false" in errors
    assert "resume_mismatch='ignore': use error or warn" in errors
    deepspeed = compose_config(["strategy=deepspeed", "resume_reset_optimizer=true"])
    assert any("DeepSpeed restores its optimizer" in e for e in config_errors(deepspeed))


@pytest.mark.parametrize("seed", [-1, -5, 2**32])
def test_a_seed_outside_numpys_range_is_refused(seed: int) -> None:
    (error,) = config_errors({"seed": seed})
    assert f"seed={seed}: must be an integer in [0, 4294967295]; e.g. seed=0" == error
    assert config_errors({"seed": 2**32 - 1}) == []


def test_fp16_autocast_on_a_cpu_is_refused_naming_bf16() -> None:
    trainer = {"precision": "16-mixed", "accelerator": "cpu"}
    (error,) = config_errors({"trainer": trainer})
    assert "trainer.precision=16-mixed on a CPU" in error
    assert "use trainer.precision=bf16-mixed (or 32-true)" in error
    assert config_errors({"trainer": {**trainer, "precision": "bf16-mixed"}}) == []
    on_a_gpu = config_errors({"trainer": {**trainer, "accelerator": "gpu"}})
    assert not [e for e in on_a_gpu if "precision" in e]  # (a GPU-less machine: refused as such)


def test_a_run_directory_with_a_tilde_is_refused_in_the_config() -> None:
    (error,) = config_errors({"output_dir": "/tmp/cwd/~/x"})
    assert "Hydra does not expand '~'" in error


def test_early_stopping_settings_are_checked() -> None:
    """patience=-1 was taken without a word (and acted as 0)."""
    cfg = compose_config(["debug=smoke", "+callbacks=early_stopping"], output_dir="/tmp/unused")
    assert config_errors(cfg) == []
    cfg.callbacks.early_stopping.patience = -1
    cfg.callbacks.early_stopping.min_delta = -0.5
    errors = config_errors(cfg)
    assert any(
        e.startswith("callbacks.early_stopping.patience=-1: must be an integer >= 0")
        for e in errors
    ), errors
    assert any(e.startswith("callbacks.early_stopping.min_delta=-0.5") for e in errors), errors


def test_chat_data_with_a_teacher_cache_is_refused_with_the_config() -> None:
    """It was a ValueError traceback once the teacher had loaded and the data was read."""
    chat = ["debug=smoke", "data=chat", "data.files=[c.jsonl]"]
    cfg = compose_config([*chat, "distill.teacher_cache=/tmp/a_cache"], output_dir="/tmp/unused")
    assert any(
        e.startswith("distill.teacher_cache='/tmp/a_cache' with chat data: a teacher cache holds")
        for e in config_errors(cfg)
    )
    for kept in ("null", "auto"):
        cfg = compose_config([*chat, f"distill.teacher_cache={kept}"], output_dir="/tmp/unused")
        assert not any("with chat data" in e for e in config_errors(cfg))


SECOND = "{name: b, weight: 0.5, path: smollm2, cache: /tmp/b_cache}"


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (["data=chat", "data.files=[c.jsonl]"], "with chat data: a teacher cache holds plain"),
        (
            ["data.streaming=true", "data.dataset.path=json", "distill.blockwise_passes=0"],
            "with data.streaming=true: a cache holds the teacher's records of fixed blocks",
        ),
    ],
    ids=["chat", "stream"],
)
def test_a_teachers_entrys_cache_the_data_cannot_use_is_refused_with_the_config(data, said):
    """Only distill.teacher_cache was: an entry's was a traceback once every model had loaded
    (chat), or a refusal of "0 blocks" advising a cache command that refuses the data (probe
    44)."""
    teachers = f"teachers=[{{name: a, weight: 0.5}}, {SECOND}]"
    cfg = compose_config(["debug=smoke", *data, teachers], output_dir="/tmp/unused")
    expected = f"teachers.1.cache='/tmp/b_cache' {said}"
    assert any(
        e.startswith(expected) and "set teachers.1.cache=null" in e for e in config_errors(cfg)
    )
