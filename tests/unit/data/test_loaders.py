"""``data/loaders.py``: the training and validation loaders' workers leave stop signals to the
run (probe 35: a SIGTERM to the process group killed them, and the run ended in tracebacks)."""

from __future__ import annotations

import signal

from torch.utils.data import DataLoader, Dataset

from lightning_kd.data.loaders import leave_stops_to_the_run
from tests.conftest import make_datamodule


class Handlers(Dataset):
    """What a worker does with SIGTERM and SIGINT, as its one item."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[int, int]:
        return int(signal.getsignal(signal.SIGTERM)), int(signal.getsignal(signal.SIGINT))


def test_a_worker_ignores_the_stop_its_run_handles() -> None:
    loader = DataLoader(
        Handlers(), batch_size=None, num_workers=1, worker_init_fn=leave_stops_to_the_run
    )
    (handled,) = list(loader)
    assert tuple(handled) == (int(signal.SIG_IGN), int(signal.SIG_IGN))


def test_both_splits_loaders_give_their_workers_the_signals_init(corpus) -> None:
    data = make_datamodule([corpus], num_workers=1)
    data.setup()
    for loader in (data.train_dataloader(), data.val_dataloader()):
        assert loader.worker_init_fn is leave_stops_to_the_run
