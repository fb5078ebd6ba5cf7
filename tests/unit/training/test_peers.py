"""A process of the run found gone at a collective: told by the processes left."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from lightning_kd.training.joining import JoinError
from lightning_kd.training.peers import PeerLost, as_peer_lost, lost_told

GLOO = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:17805: "
    "Connection reset by peer. This is typically caused by a remote worker hanging"
)


NCCL_REMOTE = (
    "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, remote "
    "process exited or there was a network error, NCCL version 2.21.5\nncclRemoteError: A call "
    "failed possibly due to a network error or a remote process exiting prematurely."
)


def test_a_collectives_lost_peer_is_named_with_the_rank_and_torchs_words() -> None:
    lost = as_peer_lost(RuntimeError(GLOO), rank=1, world_size=2)
    assert isinstance(lost, PeerLost) and isinstance(lost.__cause__, RuntimeError)
    assert str(lost).startswith(
        "process 1 of the run found another of its 2 processes gone at a collective"
    )
    assert "Connection reset by peer" in str(lost)
    nccl = as_peer_lost(dist.DistBackendError(NCCL_REMOTE), 3, 8)
    assert isinstance(nccl, PeerLost) and "of its 8 processes" in str(nccl)


def test_other_errors_and_one_process_are_left_as_they_are() -> None:
    error = RuntimeError("CUDA out of memory")
    assert as_peer_lost(error, 1, 2) is error
    alone = RuntimeError(GLOO)  # one process has no peer: whatever it is, not this
    assert as_peer_lost(alone, 0, 1) is alone
    lost = PeerLost("said")
    assert as_peer_lost(lost, 0, 2) is lost


def test_this_processs_own_backend_fault_and_a_failed_join_are_not_a_lost_peer() -> None:
    """Any DistError was told as another process gone, sending the user to the other nodes'
    logs for a fault of this one; a join that failed lost its own advice (probe 30)."""
    own = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, invalid usage")
    assert as_peer_lost(own, 0, 2) is own
    joined = JoinError("process 1 of the run could not join process 0: Connection reset by peer")
    assert as_peer_lost(joined, 1, 2) is joined


def test_a_block_ends_its_lost_peer_with_what_is_kept() -> None:
    said = r"process 0 of the cache command .*; the shards are kept"
    with (
        pytest.raises(PeerLost, match=said),
        lost_told(0, 2, "the cache command", "the shards are kept"),
    ):
        raise RuntimeError(GLOO)
    with pytest.raises(ValueError), lost_told(0, 2, "the cache command", "kept"):
        raise ValueError("a bad row")
