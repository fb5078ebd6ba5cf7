"""A process of a run that is gone mid-run, told by the processes left rather than as a traceback.

Once every process has joined the process group (``joining.py``), a process that dies (killed,
out of memory, its node lost) is seen by the others only at their next collective, as the
backend's own error: gloo's ``RuntimeError: [.../pair.cc:537] Read error [...]: Connection reset
by peer``, NCCL's ``DistBackendError``. Each process left stops there; it prints what happened and
how to go on (``launch/stop_report.py``, ``launch/cache.py``) and exits 1 without a traceback.
Which process died, and why, is told by its own output (or its node's, or the scheduler's).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

PEER_MARKS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)
"""What gloo's and NCCL's errors say when the other end of a collective is gone."""


class PeerLost(RuntimeError):
    """Another process of the run stopped or died; this one stopped at its next collective."""

    reported = False
    """Whether the stop report already said it (the command then exits 1 without a word)."""


def as_peer_lost(
    error: BaseException, rank: int, world_size: int, role: str = "the run"
) -> BaseException:
    """``error`` as the :class:`PeerLost` it is when a collective of a run of ``world_size``
    processes found another process gone; ``error`` itself otherwise."""
    if world_size <= 1 or isinstance(error, PeerLost):
        return error
    found = isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(mark in str(error) for mark in PEER_MARKS)
    )
    if not found:
        return error
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    lost = PeerLost(
        f"process {rank} of {role} found another of its {world_size} processes gone at a "
        f"collective: it stopped or died, and its own output (or its node's) says why "
        f"(torch: {first})"
    )
    lost.__cause__ = error
    return lost


@contextmanager
def lost_told(rank: int, world_size: int, role: str, after: str) -> Iterator[None]:
    """Run the block, a process found gone at a collective raised as :class:`PeerLost` that
    ends with ``after``: what is kept, and how to go on."""
    try:
        yield
    except BaseException as error:
        lost = as_peer_lost(error, rank, world_size, role)
        if lost is error:
            raise
        raise PeerLost(f"{lost}; {after}") from error
