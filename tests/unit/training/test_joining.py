"""The join of a run's processes (training/joining.py): a node that never comes is told, through
Lightning's own DDP strategy joining a real gloo process group, with a short timeout."""

from __future__ import annotations

import signal
import socket
from datetime import timedelta

import lightning as L
import pytest
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from lightning_kd.training.joining import JoinError, joining
from tests.unit.training.test_strategies import free_port


def node_of_two(monkeypatch, rank: int) -> L.Trainer:
    """Node ``rank`` of a 2-node run of one process each, as torchrun's environment tells it,
    whose other node never starts; its store gives up after 2 s (30 minutes by default)."""
    environment = {"TORCHELASTIC_RUN_ID": "test", "MASTER_ADDR": "127.0.0.1"}
    environment |= {"MASTER_PORT": str(free_port()), "WORLD_SIZE": "2", "RANK": str(rank)}
    environment |= {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank)}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=2))
    return L.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy=strategy, logger=False)


def test_rank_zero_waiting_in_vain_is_told_what_to_check(monkeypatch) -> None:
    trainer = node_of_two(monkeypatch, rank=0)
    with pytest.raises(JoinError) as refused, joining(trainer.strategy):
        trainer.strategy.setup_environment()  # what a Trainer's first stage does
    message = str(refused.value)
    assert message.startswith("the other processes of the run never all joined process 0 at")
    assert "2 processes: trainer.num_nodes=2 x trainer.devices=1" in message
    assert "1/2 clients joined" in message, "torch's count of who joined is kept"
    assert "torchrun --nnodes and --nproc-per-node; SLURM --nodes" in message
    assert not dist.is_initialized()
    assert signal.set_wakeup_fd(-1) == -1, "the watch ends with the block"


def test_a_rank_that_cannot_reach_rank_zero_is_told_to_check_node_zero(monkeypatch) -> None:
    trainer = node_of_two(monkeypatch, rank=1)
    port = trainer.strategy.cluster_environment.main_port
    with pytest.raises(JoinError) as refused, joining(trainer.strategy):
        trainer.strategy.setup_environment()
    message = str(refused.value)
    assert message.startswith(f"process 1 of the run could not join process 0 at 127.0.0.1:{port}")
    assert "check that node 0 is started" in message and "not localhost" in message
    assert isinstance(refused.value.__cause__, dist.DistNetworkError)


def test_a_port_in_use_is_named_as_such(monkeypatch) -> None:
    """MASTER_PORT held by another run: process 0 could not listen, and was told the others
    never joined and to fix trainer.num_nodes and trainer.devices. The processes it started
    are stopped with it: rank 1 was left waiting, re-parented to init (probe 35)."""
    from lightning_kd.training import joining as module

    handed: list[int] = []
    monkeypatch.setattr(module, "signal_started_processes", lambda _, signum: handed.append(signum))
    trainer = node_of_two(monkeypatch, rank=0)
    port = trainer.strategy.cluster_environment.main_port
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(JoinError) as refused, joining(trainer.strategy):
            trainer.strategy.setup_environment()
    message = str(refused.value)
    assert message.startswith(f"process 0 of the run could not listen at 127.0.0.1:{port}")
    assert "the port is in use on this machine (another run?); unset MASTER_PORT" in message
    assert handed == [signal.SIGTERM]


def test_one_process_is_left_alone() -> None:
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False)
    with pytest.raises(dist.DistError, match="not a join"), joining(trainer.strategy):
        raise dist.DistError("not a join")  # one process has no join to tell


def test_a_failed_join_ends_the_command_with_its_message_alone(monkeypatch, tmp_path, capsys):
    """Exit 1 and the message, no traceback (it was torch's DistStoreError traceback)."""
    from lightning_kd.cli.hydra_command import run_hydra

    def first_stage(cfg) -> None:
        trainer = node_of_two(monkeypatch, rank=0)
        with joining(trainer.strategy):
            trainer.strategy.setup_environment()

    with pytest.raises(SystemExit) as exit_:
        run_hydra(first_stage, ["debug=smoke", f"hydra.run.dir={tmp_path}/run"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            "lightning-kd: the other processes of the run never all joined process 0 at 127.0.0.1:"
        )
    )
    assert "Traceback" not in err
