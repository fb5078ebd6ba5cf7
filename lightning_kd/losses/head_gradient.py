"""The output head's weight gradient of the chunked loss, summed over its chunks."""

from __future__ import annotations

import torch
from torch import Tensor


class HeadGradient:
    """The head weight's gradient, summed over chunks in the matmul dtype (an in-place ``addmm_``)
    and, where that is not the weight's (bf16 under ``bf16-mixed``), added to a buffer of the
    weight's dtype every :attr:`FLUSH` chunks: the error of a bf16 sum grows with its
    terms (1.1e-2 over 255 chunks against plain autocast's 2.7e-3), and converting every chunk's
    vocab-sized term costs five of its ``addmm_``."""

    FLUSH = 8

    def __init__(self, weight: Tensor, dtype: torch.dtype) -> None:
        self.partial = torch.zeros_like(weight, dtype=dtype)
        # The weights' dtype, as Liger accumulates: fp32 master weights under bf16-mixed; under
        # bf16-true an fp32 buffer would cost 4 bytes a head weight for a bf16 gradient.
        wide = weight.dtype
        self.sum = None if wide == dtype else torch.zeros_like(weight, dtype=wide)
        self.terms = 0

    def add(self, grad_logits: Tensor, hidden: Tensor) -> None:
        self.partial.addmm_(grad_logits.T, hidden)
        self.terms += 1
        if self.sum is not None and self.terms % self.FLUSH == 0:
            self.sum += self.partial
            self.partial.zero_()

    def total(self) -> Tensor:
        """The gradient summed over every chunk, in the weight's dtype where the matmul's is
        another."""
        if self.sum is None:
            return self.partial
        self.sum += self.partial
        self.partial = None  # its memory back before backward
        return self.sum
