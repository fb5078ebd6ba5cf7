"""Weights that hold NaN or infinity: a file damaged on disk (bit rot, a bad copy) or a run that
diverged. Checked before a model's outputs are judged: a causality check compared NaN with NaN
and called a plain causal LM "a bidirectional encoder", or failed inside ``torch.allclose`` with
a negative tolerance (probe 59)."""

from __future__ import annotations

import torch
from torch import nn

SHOWN = 3
"""Tensors named in a refusal; the rest counted."""


def nonfinite_tensors(model: nn.Module) -> list[tuple[str, int]]:
    """``(name, count)`` of each of ``model``'s floating-point parameters and buffers holding NaN
    or infinity (a quantized tensor's not read: torchao's have no ``isfinite``, and under
    inference mode not even a ``state_dict``)."""
    found = []
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if type(tensor) not in (torch.Tensor, nn.Parameter) or not tensor.is_floating_point():
            continue
        if tensor.numel() and (bad := int((~torch.isfinite(tensor.detach())).sum())):
            found.append((name, bad))
    return found


def nonfinite_error(model: nn.Module, who: str, fix: str) -> str | None:
    """Why ``model`` (``who``: "the student", a path) cannot be used, if its weights hold NaN or
    infinity: the tensors and counts, then ``fix``."""
    found = nonfinite_tensors(model)
    if not found:
        return None
    named = ", ".join(f"{name} ({count})" for name, count in found[:SHOWN])
    more = f" and {len(found) - SHOWN} more tensors" if len(found) > SHOWN else ""
    return (
        f"{who} ({type(model).__name__}) has weights that are NaN or infinite: {named}{more} "
        f"(values per tensor); its file is damaged or its training diverged. {fix}"
    )
