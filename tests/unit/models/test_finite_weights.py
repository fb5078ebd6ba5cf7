"""Weights that hold NaN or infinity, named with their counts."""

from __future__ import annotations

import torch

from lightning_kd.models.finite_weights import nonfinite_error, nonfinite_tensors


def test_each_tensor_of_nan_or_infinity_is_named_with_its_count() -> None:
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(5)))
    assert nonfinite_tensors(model) == [] and nonfinite_error(model, "the student", "Fix.") is None
    with torch.no_grad():
        model[0].weight[0, :3] = float("nan")
        model[1].bias[1] = float("-inf")
        for layer in model[2:]:
            layer.weight[0, 0] = float("inf")
    assert nonfinite_tensors(model)[:2] == [("0.weight", 3), ("1.bias", 1)]
    assert nonfinite_error(model, "the student", "Fix.") == (
        "the student (Sequential) has weights that are NaN or infinite: 0.weight (3), 1.bias (1), "
        "2.weight (1) and 2 more tensors (values per tensor); its file is damaged or its training "
        "diverged. Fix."
    )
