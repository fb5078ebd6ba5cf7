"""``trainer.precision`` choices that would not run as recorded, refused with the config."""

from __future__ import annotations

from omegaconf import OmegaConf

from lightning_kd.launch.checks import config_errors
from lightning_kd.launch.config import compose_config
from lightning_kd.launch.precision_checks import precision_errors


def test_fp16_weights_are_refused_naming_the_precisions_that_train() -> None:
    (error,) = config_errors({"trainer": {"precision": "16-true"}})
    assert "trainer.precision=16-true keeps the student's weights" in error
    assert "first update writes NaN" in error and "use trainer.precision=16-mixed" in error


def test_a_teacher_dtype_a_true_precision_would_cast_is_refused() -> None:
    """bf16-true casts the whole LightningModule, the teacher too: a float32 teacher ran in bf16
    while the summary recorded float32."""
    cfg = {"trainer": {"precision": "bf16-true"}, "teacher": {"dtype": "float32"}}
    (error,) = config_errors(cfg)
    assert error.startswith("teacher.dtype=float32 with trainer.precision=bf16-true: Lightning")
    assert "set teacher.dtype=bfloat16 (or auto), or keep the teacher in float32 with " in error
    assert error.endswith("trainer.precision=bf16-mixed")
    (error,) = config_errors(
        {"trainer": {"precision": "64-true"}, "teacher": {"dtype": "bfloat16"}}
    )
    assert "casts every module to float64" in error
    for dtype in ("auto", "bfloat16", None):
        assert config_errors({**cfg, "teacher": {"dtype": dtype}}) == []
    assert config_errors({**cfg, "trainer": {"precision": "bf16-mixed"}}) == []


def test_a_teachers_entry_dtype_is_checked_too() -> None:
    teachers = [{"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.5, "dtype": "float16"}]
    cfg = OmegaConf.create({"trainer": {"precision": "bf16-true"}, "teachers": teachers})
    (error,) = precision_errors(cfg)
    assert error.startswith("teachers[1].dtype=float16 with trainer.precision=bf16-true")


def test_a_precision_lightning_does_not_have_is_refused_with_the_config() -> None:
    """Lightning refused it only as the Trainer was built, inside Hydra's traceback."""
    (error,) = config_errors({"trainer": {"precision": "bogus"}})
    assert error.startswith("trainer.precision=bogus: choose one of auto, bf16-mixed")
    assert config_errors({"trainer": {"precision": "auto"}}) == []


def test_float64_under_deepspeed_zero3_is_refused() -> None:
    """ZeRO-3's ``zero.Init``, in which the models are built, casts them to float32 and cannot
    hold float64: a float64 student trained in float32 while the run recorded float64."""
    zero3 = {"_target_": "lightning_kd.training.strategies.deepspeed", "stage": 3}
    cfg = {"trainer": {"strategy": zero3}, "student": {"dtype": "float64"}}
    cfg |= {"teacher": {"dtype": "float64"}}
    errors = config_errors(cfg)
    assert [error.split(" with ")[0] for error in errors] == [
        "student.dtype=float64",
        "teacher.dtype=float64",
    ]
    assert "in float32, bfloat16 or float16 only" in errors[0]
    assert "keep float64 with strategy=deepspeed_zero2" in errors[0]
    (error,) = config_errors({"trainer": {"strategy": "deepspeed_stage_3", "precision": "64-true"}})
    assert error.startswith("trainer.precision=64-true with strategy=deepspeed (ZeRO-3)")
    for strategy in ({**zero3, "stage": 2}, "ddp", "deepspeed_stage_2"):
        assert config_errors({**cfg, "trainer": {"strategy": strategy}}) == []
    assert config_errors({**cfg, "student": {"dtype": "float32"}, "teacher": {}}) == []


def test_the_shipped_deepspeed_config_is_zero3_and_its_zero2_is_not() -> None:
    float64 = ["student.dtype=float64", "distill.blockwise_passes=0"]
    (error,) = config_errors(compose_config(["strategy=deepspeed", *float64]))
    assert error.startswith("student.dtype=float64 with strategy=deepspeed (ZeRO-3)")
    assert config_errors(compose_config(["strategy=deepspeed_zero2", *float64])) == []
