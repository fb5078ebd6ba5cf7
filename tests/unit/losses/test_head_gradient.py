"""The chunked loss's head-weight gradient: bf16 sums a few chunks long, added up in fp32."""

from __future__ import annotations

import torch

from lightning_kd.losses.head_gradient import HeadGradient


def terms(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        (torch.randn(16, 64, generator=generator), torch.randn(16, 8, generator=generator))
        for _ in range(count)
    ]


def relative_error(count: int) -> float:
    weight = torch.zeros(64, 8)  # fp32 master weights, a bf16 matmul (bf16-mixed)
    summed = HeadGradient(weight, torch.bfloat16)
    exact = torch.zeros(64, 8, dtype=torch.float64)
    for grad_logits, hidden in terms(count):
        summed.add(grad_logits.bfloat16(), hidden.bfloat16())
        exact += grad_logits.bfloat16().double().T @ hidden.bfloat16().double()
    total = summed.total()
    assert total.dtype == torch.float32
    return float((total.double() - exact).norm() / exact.norm())


def test_the_error_stays_that_of_a_few_chunks_however_many_there_are() -> None:
    """One bf16 buffer for every chunk: its error grew with the chunks (1.1e-2 at 255 against
    plain autocast's 2.7e-3, probe 24)."""
    few, many = relative_error(HeadGradient.FLUSH), relative_error(32 * HeadGradient.FLUSH)
    assert many < 2 * few


def test_a_matmul_in_the_weights_dtype_keeps_one_buffer() -> None:
    """fp32 without autocast, bf16 under bf16-true: nothing to add up in another dtype."""
    for dtype in (torch.float32, torch.bfloat16):
        summed = HeadGradient(torch.zeros(64, 8, dtype=dtype), dtype)
        expected = torch.zeros(64, 8, dtype=dtype)
        for grad_logits, hidden in terms(20):
            summed.add(grad_logits.to(dtype), hidden.to(dtype))
            expected.addmm_(grad_logits.to(dtype).T, hidden.to(dtype))
        assert summed.sum is None
        torch.testing.assert_close(summed.total(), expected, rtol=0, atol=0)
