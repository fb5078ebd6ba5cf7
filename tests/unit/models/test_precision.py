"""Precision from the hardware: trainer.precision=auto and teacher.dtype=auto (probes mocked)."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_kd.models import precision
from lightning_kd.models.precision import (
    Hardware,
    PrecisionChoice,
    probe_hardware,
    resolve_precision,
    teacher_dtype_for,
)

CUDA_BF16 = Hardware("cuda", True, "NVIDIA H200")
CUDA_NO_BF16 = Hardware("cuda", False, "Tesla T4")
CPU_BF16 = Hardware("cpu", True, "CPU (AVX512)")
CPU_NO_BF16 = Hardware("cpu", False, "CPU (AVX2)")


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        (CUDA_BF16, ("bf16-mixed", "bfloat16")),
        (CUDA_NO_BF16, ("16-mixed", "float16")),
        (CPU_BF16, ("bf16-mixed", "bfloat16")),
        (CPU_NO_BF16, ("32-true", "float32")),
    ],
    ids=["cuda-bf16", "cuda-no-bf16", "cpu-bf16", "cpu-no-bf16"],
)
def test_auto_picks_what_the_hardware_computes_natively(hardware, expected) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto never warns
        choice = resolve_precision("auto", "auto", hardware)
    assert (choice.precision, choice.teacher_dtype) == expected
    assert hardware.name in choice.reason
    line = choice.line()
    assert f"trainer.precision={expected[0]}" in line and f"teacher.dtype={expected[1]}" in line


@pytest.mark.parametrize("hardware", [CUDA_BF16, CUDA_NO_BF16, CPU_BF16, CPU_NO_BF16])
def test_explicit_settings_win(hardware, monkeypatch) -> None:
    monkeypatch.setattr(precision, "bf16_slowdown", lambda: 30.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        choice = resolve_precision("32-true", "bfloat16", hardware)
        follows = resolve_precision("bf16-mixed", "auto", hardware)
    assert (choice.precision, choice.teacher_dtype) == ("32-true", "bfloat16")
    assert "set explicitly" in choice.reason
    assert (follows.precision, follows.teacher_dtype) == ("bf16-mixed", "bfloat16")


def test_explicit_bf16_without_native_bf16_warns_once_with_slowdown_and_fix(monkeypatch) -> None:
    monkeypatch.setattr(precision, "bf16_slowdown", lambda: 58.0)
    with pytest.warns(UserWarning) as record:
        resolve_precision("bf16-mixed", "auto", CPU_NO_BF16)
    messages = [str(w.message) for w in record if "bf16" in str(w.message)]
    assert len(messages) == 1
    assert "58x slower than fp32" in messages[0]
    assert "trainer.precision=auto" in messages[0] and "32-true" in messages[0]


@pytest.mark.parametrize("hardware", [CUDA_BF16, CPU_BF16])
def test_explicit_bf16_with_native_bf16_does_not_warn(hardware) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        choice = resolve_precision("bf16-mixed", "bfloat16", hardware)
    assert choice.precision == "bf16-mixed"


def test_a_bf16_teacher_alone_warns_too(monkeypatch) -> None:
    monkeypatch.setattr(precision, "bf16_slowdown", lambda: 20.0)
    with pytest.warns(UserWarning, match="20x slower"):
        resolve_precision("32-true", "bfloat16", CPU_NO_BF16)


def test_unknown_precision_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"trainer.precision='fp8'.*auto"):
        resolve_precision("fp8", "auto", CPU_NO_BF16)


def test_probes(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla T4")
    assert probe_hardware("auto") == CUDA_NO_BF16
    assert probe_hardware("cpu").device == "cpu"  # an explicit CPU run ignores the GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert probe_hardware("auto") == CPU_BF16
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: False)
    assert probe_hardware("gpu").device == "cpu"  # no CUDA: what Lightning would refuse anyway


def test_teacher_dtype_follows_the_trainer_precision(monkeypatch) -> None:
    assert teacher_dtype_for("bf16-mixed") == "bfloat16"
    assert teacher_dtype_for("16-mixed") == "float16"
    assert teacher_dtype_for("32-true") == "float32"
    assert teacher_dtype_for("64-true") == "float64"
    monkeypatch.setattr(precision, "probe_hardware", lambda *a: CPU_NO_BF16)
    assert teacher_dtype_for(None) == "float32"


def test_bf16_slowdown_is_a_measured_ratio() -> None:
    assert precision.bf16_slowdown(rows=8, repeats=1) > 0


def test_choice_is_recorded_as_plain_strings() -> None:
    choice = PrecisionChoice("32-true", "float32", "why")
    assert choice.as_dict() == {
        "trainer.precision": "32-true",
        "teacher.dtype": "float32",
        "reason": "why",
    }
