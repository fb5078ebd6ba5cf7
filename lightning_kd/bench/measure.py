"""Measuring a process from inside: resident and peak memory (CPU or CUDA), step time, and the
page faulting that makes memory-mapped weights count. Used by the benchmark and the soak."""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import time
from collections.abc import Callable

import torch

from lightning_kd.models.quantize import is_quantized


def rss_mb() -> float:
    """This process's resident memory now (not its peak), in MB (Linux)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``), so that memory an
    earlier measurement freed but the allocator kept is neither counted nor silently reused."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory window (after warm-up, so one-off costs such as compiling the
    loss do not count): CUDA's peak stats, or Linux's VmHWM via ``/proc/self/clear_refs``."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def peak_mb(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak`: CUDA max allocated, or peak RSS (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with open("/proc/self/status") as handle:
        line = next(row for row in handle if row.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024  # kB


def current_mb(device: torch.device) -> float:
    """Memory in use now: CUDA allocated, or this process's RSS."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return rss_mb()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a wall-clock reading includes it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    """Median wall time of ``step()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fault_in(model: torch.nn.Module) -> None:
    """Read every parameter once, so its pages are resident before the measurement starts.

    Weights loaded from safetensors are memory-mapped: pages a measurement never reads (the
    teacher's, in the benchmark's ``floor``) would not count in its RSS, and the floor would be
    measured without the teacher it is defined to hold.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if not is_quantized(parameter):  # quantized in memory (teacher.quantize): not mapped
                parameter.sum().item()
