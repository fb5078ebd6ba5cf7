"""Numeric precision chosen from the hardware: ``trainer.precision=auto``, ``teacher.dtype=auto``.

bf16 halves the memory of activations and of a frozen teacher, and on hardware that computes it
natively it is the fastest choice. Elsewhere it is the slowest: on a CPU without AVX512-BF16 or
AMX, oneDNN emulates bf16 and a matmul runs tens of times slower than in fp32. So ``auto`` picks

- ``bf16-mixed`` with a bf16 teacher where the device computes bf16 natively (a CUDA device with
  bf16; a CPU whose oneDNN reports bf16 support),
- ``16-mixed`` with an fp16 teacher on a CUDA device without bf16,
- ``32-true`` with an fp32 teacher everywhere else,

and says which and why in one line. An explicit setting always wins; an explicit bf16 on a device
without native bf16 gets one warning that measures the slowdown there and names the override.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

AUTO = "auto"

TEACHER_DTYPE_OF = {
    "bf16-mixed": "bfloat16",
    "bf16-true": "bfloat16",
    "bf16": "bfloat16",
    "16-mixed": "float16",
    "16-true": "float16",
    "16": "float16",
    "32-true": "float32",
    "32": "float32",
    "64-true": "float64",
    "64": "float64",
}
"""The teacher dtype that goes with each Lightning precision (``teacher.dtype=auto``)."""


@dataclass(frozen=True)
class Hardware:
    """What the run computes on, as far as precision is concerned."""

    device: str
    """``cuda`` or ``cpu`` (any other accelerator counts as having no native bf16 here)."""
    native_bf16: bool
    """Whether bf16 matmuls run natively (not emulated) on this device."""
    name: str
    """For messages: the GPU's name, or the CPU's instruction-set level (``AVX2``, ...)."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The resolved ``trainer.precision`` and ``teacher.dtype``, and why."""

    precision: str
    teacher_dtype: str
    reason: str

    def line(self) -> str:
        """The one line a run prints about its precision."""
        return (
            f"precision: trainer.precision={self.precision} teacher.dtype={self.teacher_dtype} "
            f"({self.reason})"
        )

    def as_dict(self) -> dict[str, str]:
        return {
            "trainer.precision": self.precision,
            "teacher.dtype": self.teacher_dtype,
            "reason": self.reason,
        }


def cpu_native_bf16() -> bool:
    """Whether oneDNN computes bf16 natively on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: no fast bf16 path
        return False


def probe_hardware(accelerator: str | None = AUTO) -> Hardware:
    """The device ``trainer.accelerator`` runs on and whether it computes bf16 natively."""
    accelerator = (accelerator or AUTO).lower()
    use_cuda = accelerator in ("cuda", "gpu") or (accelerator == AUTO and torch.cuda.is_available())
    if use_cuda and torch.cuda.is_available():
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return Hardware("cuda", native, torch.cuda.get_device_name())
    if accelerator not in (AUTO, "cpu", "cuda", "gpu"):
        return Hardware(accelerator, False, accelerator)
    return Hardware("cpu", cpu_native_bf16(), f"CPU ({torch.backends.cpu.get_cpu_capability()})")


def auto_precision(hardware: Hardware) -> tuple[str, str]:
    """The precision ``auto`` picks on ``hardware``, and the reason in words."""
    if hardware.native_bf16:
        return "bf16-mixed", f"{hardware.name} computes bf16 natively"
    if hardware.device == "cuda":
        return "16-mixed", f"{hardware.name} has no native bf16: fp16 with loss scaling"
    return "32-true", f"{hardware.name} has no native bf16: emulated bf16 would be far slower"


def resolve_precision(
    precision: str | int | None, teacher_dtype: str | None, hardware: Hardware
) -> PrecisionChoice:
    """Turn ``auto`` into concrete settings for ``hardware``; explicit settings pass through.

    ``teacher.dtype=auto`` follows the resolved precision (a bf16 run gets a bf16 teacher, an fp32
    run an fp32 one). Warns once when an explicit setting asks for bf16 that ``hardware`` only
    emulates.
    """
    precision = AUTO if precision is None else str(precision)
    teacher_dtype = AUTO if teacher_dtype is None else str(teacher_dtype)
    if precision == AUTO:
        precision, reason = auto_precision(hardware)
    else:
        reason = "trainer.precision set explicitly"
    if teacher_dtype == AUTO:
        if precision not in TEACHER_DTYPE_OF:
            raise ValueError(
                f"trainer.precision={precision!r} is not one of Lightning's precisions; choose "
                f"auto or one of {sorted(TEACHER_DTYPE_OF)}"
            )
        teacher_dtype = TEACHER_DTYPE_OF[precision]
    else:
        reason += "; teacher.dtype set explicitly"
    choice = PrecisionChoice(precision, teacher_dtype, reason)
    warn_if_emulated(choice, hardware)
    return choice


def teacher_dtype_for(precision: str | None, hardware: Hardware | None = None) -> str:
    """The teacher dtype ``teacher.dtype=auto`` means under ``precision`` (resolved on
    ``hardware``, probed if not given, when ``precision`` is None or ``auto``)."""
    if precision is None or str(precision) == AUTO:
        precision, _ = auto_precision(hardware or probe_hardware())
    return TEACHER_DTYPE_OF.get(str(precision), "float32")


def uses_bf16(choice: PrecisionChoice) -> bool:
    """Whether ``choice`` computes anything in bf16."""
    return choice.precision.startswith("bf16") or choice.teacher_dtype == "bfloat16"


def warn_if_emulated(choice: PrecisionChoice, hardware: Hardware) -> None:
    """One warning when ``choice`` computes in bf16 on hardware that only emulates it."""
    if hardware.native_bf16 or not uses_bf16(choice) or hardware.device != "cpu":
        return
    slowdown = bf16_slowdown()
    warnings.warn(
        f"bf16 requested (trainer.precision={choice.precision}, "
        f"teacher.dtype={choice.teacher_dtype}) on a {hardware.name} without native bf16: a bf16 "
        f"matmul runs {slowdown:.0f}x slower than fp32 here (measured just now). Use "
        "trainer.precision=auto teacher.dtype=auto (fp32 here), or 32-true and float32",
        UserWarning,
        stacklevel=3,
    )


def bf16_slowdown(rows: int = 64, repeats: int = 2) -> float:
    """bf16 over fp32 time of a ``[rows, 576] @ [576, 1536]`` matmul on this CPU (best of
    ``repeats``): what a bf16 run costs here, measured rather than guessed (under a second)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, 576, generator=generator)
    b = torch.randn(576, 1536, generator=generator)

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up: first calls pick kernels
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    return best(a.bfloat16(), b.bfloat16()) / max(best(a, b), 1e-9)
