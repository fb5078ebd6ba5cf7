"""A generation that ends at the next token once the process is asked to stop (SIGINT/SIGTERM).

Its own module: ``utils/stopping.py`` reads Lightning's SIGTERM exception, and the decoding the
distiller's on-policy step uses never needs Lightning (the plain-PyTorch loop asserts it)."""

from __future__ import annotations

from torch import Tensor
from transformers import StoppingCriteria

from lightning_kd.utils.stopping import STOP


class StopRequested(StoppingCriteria):
    """Ends a generation at the next token once the process is asked to stop (SIGINT/SIGTERM):
    a batch of long answers on a CPU decoded for minutes past a scheduler's grace period."""

    def __call__(self, input_ids: Tensor, scores: Tensor, **kwargs) -> bool:
        return STOP.requested
