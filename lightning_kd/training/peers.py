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

from lightning_kd.training.joining import JoinError
from lightning_kd.utils.refusal import first_line

PEER_MARKS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
    "remote process exited or there was a network error",
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
    processes found another process gone (its message says so: :data:`PEER_MARKS`); ``error``
    itself otherwise: this process's own backend fault, or a join that failed (``JoinError``
    says its own advice: no group had formed)."""
    if world_size <= 1 or isinstance(error, PeerLost | JoinError):
        return error
    if not (isinstance(error, RuntimeError) and any(mark in str(error) for mark in PEER_MARKS)):
        return error
    lost = PeerLost(
        f"process {rank} of {role} found another of its {world_size} processes gone at a "
        f"collective: it stopped or died, and its own output (or its node's) says why "
        f"(torch: {first_line(error)})"
    )
    lost.__cause__ = error
    return lost


@contextmanager
def lost_told(rank: int, world_size: int, role: str, after: str) -> Iterator[None]:
    """Run the block; when a collective in it finds another process gone, raise a
    :class:`PeerLost` whose message ends with ``after`` (what is kept, and how to go on)."""
    try:
        yield
    except BaseException as error:
        lost = as_peer_lost(error, rank, world_size, role)
        if lost is error:
            raise
        raise PeerLost(f"{lost}; {after}") from error
