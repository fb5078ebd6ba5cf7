"""torch's random state, kept in checkpoints so that a resumed run draws what the run would have.

``seed_everything`` at a resume restarts the generators from the seed: the dropout masks after it
(a LoRA adapter's ``dropout``, a GPT-2 student's) were those of step 0 again, and the resumed
losses drifted from the uninterrupted run's. Lightning saves no random state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


def rng_state() -> dict[str, object]:
    """This process's CPU generator state and, where CUDA runs, each device's."""
    state: dict[str, object] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, object]) -> None:
    """Put back what :func:`rng_state` saved (CUDA's only where as many devices run)."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def float32_init(build: Callable[P, R]) -> Callable[P, R]:
    """``build`` run with float32 as torch's default dtype: a random initialisation (a
    ``teacher.config`` teacher of ``init_seed``, a ``student.config`` student, LoRA adapters,
    projectors) draws the same numbers whatever the caller's default. Lightning's ``64-true``
    builds models under a float64 default, where the same seed drew another teacher (its weights'
    digest refused the cache the ``cache`` command had written for that very run); the models are
    cast to their dtypes after."""

    @functools.wraps(build)
    def built(*args: P.args, **kwargs: P.kwargs) -> R:
        before = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            return build(*args, **kwargs)
        finally:
            torch.set_default_dtype(before)

    return built
