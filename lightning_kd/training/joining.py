"""The wait for a run's processes to join, where a node that never comes is told, not hung on.

A run of several processes starts with every process joining one process group at rank 0's
address (Lightning's strategy does it: ``init_process_group``). Until all have joined, each one
waits inside torch's C++ store, where no Python signal handler runs: the stop request of
``utils/stopping.py`` could not be heard, and Ctrl+C or a scheduler's SIGTERM did nothing for the
store's timeout (30 minutes), which then ended in a ``DistStoreError`` traceback that named no
cause. :func:`joining` makes the wait stoppable at once (nothing of the run has started: there is
nothing to save) and turns the timeout into what to check.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from lightning_kd.utils.compat import signal_started_processes
from lightning_kd.utils.refusal import first_line
from lightning_kd.utils.stopping import stopping_while_blocked


class JoinError(RuntimeError):
    """The run's processes did not all join its process group in time."""


def joined() -> bool:
    """Whether this process's default process group exists (every process has joined)."""
    return dist.is_available() and dist.is_initialized()


@contextmanager
def joining(strategy, role: str = "the run") -> Iterator[None]:
    """Run the block that starts ``strategy``'s process group (a Trainer's first stage,
    ``Fabric.launch``) with the join stoppable and its failure told (see the module doc).
    Nothing changes for one process, or once the group exists."""
    processes = getattr(strategy, "world_size", 1)
    if processes <= 1 or joined():
        yield
        return
    rank = strategy.global_rank

    def said(signum: int) -> str:
        return (
            f"{signal.Signals(signum).name} received while process {rank} waited for the other "
            f"processes of {role} to join ({described(strategy)}): stopped at once, before "
            "anything was computed or written"
        )

    def hand_on(signum: int) -> None:  # to the processes it started: no orphan waits on
        signal_started_processes(strategy, signum)

    with stopping_while_blocked(lambda: not joined(), said, hand_on):
        try:
            yield
        except dist.DistError as error:
            if joined():
                raise
            # The processes it started wait on a join that will not come (or joined another
            # run's store on a port in use): they stop with it, none is left waiting.
            hand_on(signal.SIGTERM)
            raise JoinError(join_failure(strategy, role, error)) from error


def described(strategy) -> str:
    """The processes a strategy expects, in the settings that give their number."""
    nodes, per_node = getattr(strategy, "num_nodes", 1), getattr(strategy, "num_processes", 1)
    return (
        f"{strategy.world_size} processes: trainer.num_nodes={nodes} x trainer.devices={per_node}"
    )


def join_failure(strategy, role: str, error: BaseException) -> str:
    """What a failed join means and what to check: rank 0 waited for processes that never
    came, or another rank never reached rank 0's address."""
    environment = strategy.cluster_environment
    address = f"{environment.main_address}:{environment.main_port}"
    first = first_line(error)
    check = (
        "start the same command on every node, with the same MASTER_ADDR and MASTER_PORT, and "
        "make trainer.num_nodes and trainer.devices the launcher's own counts (torchrun "
        "--nnodes and --nproc-per-node; SLURM --nodes and --ntasks-per-node)"
    )
    if "EADDRINUSE" in str(error) or "ddress already in use" in str(error):
        return (
            f"process 0 of {role} could not listen at {address}: the port is in use on this "
            f"machine (another run?); unset MASTER_PORT, or give a free one (torch: {first})"
        )
    if strategy.global_rank == 0:
        return (
            f"the other processes of {role} never all joined process 0 at {address} "
            f"({described(strategy)}; torch: {first}): {check}"
        )
    return (
        f"process {strategy.global_rank} of {role} could not join process 0 at {address} "
        f"({described(strategy)}; torch: {first}): check that node 0 is started and that "
        f"{address} is reachable from this node (MASTER_ADDR must name node 0, not localhost, "
        f"and its port must be open); {check}"
    )
