"""Training-order samplers and loaders: the same batches on every run, rank count and resume.

``EpochSampler`` draws one seeded permutation per epoch, and ``RankShare`` deals it to N ranks
(N ranks together see the batches one process sees); ``ResumableLoader`` starts a resumed epoch
where the interrupted one stopped, without collating the batches it skips. ``FullBatchShare``
gives each rank its share of every full global batch, for work outside Lightning's loop (the
block-wise repair, ``repair.py``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from itertools import islice

import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from lightning_kd.data.errors import DataError
from lightning_kd.utils.compat import resumed_batches_in_epoch


class EpochSampler(RandomSampler):
    """A permutation of the dataset drawn from ``seed + epoch``: the same on every run.

    It draws exactly the permutation ``DistributedSampler`` draws, and Lightning replaces a
    ``RandomSampler`` by a ``DistributedSampler`` (seeded from the global seed) under DDP: so N
    ranks together see the very batches one process sees. Lightning calls :meth:`set_epoch`.
    """

    def __init__(self, data_source, seed: int) -> None:
        super().__init__(data_source)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(len(self.data_source), generator=generator).tolist())


class RankShare(DistributedSampler):
    """This rank's share of each epoch's permutation — :class:`EpochSampler`'s, of the ``blocks``
    real blocks — dealt as ``DistributedSampler`` deals it (rank r takes every N-th from r), so
    N ranks' step i together is one process's step i with N times the batch.

    Where the blocks do not divide by N, ``DistributedSampler`` repeated the first few at the
    end, and a repeated block counted twice in the epoch's last step (41 blocks on 2 ranks: 63
    tokens more than one process trains on). Here the dataset holds ``Unscored`` padding after
    the real blocks (``batches.pad_for_ranks``), dealt in their place: run through the models,
    scored nowhere. Lightning keeps a sampler that is a ``DistributedSampler`` as it is."""

    def __init__(self, dataset, blocks: int, seed: int, world_size: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.blocks = blocks

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.blocks, generator=generator).tolist()
        order += range(self.blocks, len(self.dataset))
        return iter(order[self.rank :: self.num_replicas])


def training_order(dataset, blocks: int, seed: int, rank: int, world_size: int) -> Sampler[int]:
    """The order ``dataset``'s ``blocks`` real blocks are trained in (padded for the ranks
    after them): :class:`EpochSampler` in one process, :class:`RankShare` in several."""
    if world_size == 1:
        return EpochSampler(dataset, seed)
    return RankShare(dataset, blocks, seed, world_size, rank)


def leave_stops_to_the_run(worker_id: int) -> None:
    """A DataLoader worker (``data.num_workers``) ignores SIGTERM and SIGINT: a stop sent to the
    whole process group (SLURM's time limit, ``scancel``, ``kill -- -PGID``) reached the workers
    too, and a worker it killed ended the run in tracebacks, exit 1, the validation at the stop
    lost, before the run could stop at its next clean point. The run ends its workers itself
    (and a worker whose run is gone exits on its own). Seeded as Lightning seeds workers where
    ``seed_everything(workers=True)`` asked it (its own init is added only to loaders without
    one)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id)


class ResumableLoader(DataLoader):
    """A DataLoader that starts an iteration ``skip_batches()`` batches in.

    After a mid-epoch resume, that is the number of batches the interrupted epoch had trained on;
    the skipped batches are never collated. Its workers leave stop signals to the run
    (:func:`leave_stops_to_the_run`), for the validation split too.
    """

    def __init__(self, *args, skip_batches: Callable[[], int] | None = None, **kwargs) -> None:
        kwargs.setdefault("worker_init_fn", leave_stops_to_the_run)
        super().__init__(*args, **kwargs)
        self.skip_batches = skip_batches  # same name as the argument: Lightning re-creates loaders

    def __iter__(self) -> Iterator:
        skip = self.skip_batches() if self.skip_batches is not None else 0
        if skip == 0:
            yield from super().__iter__()
            return
        batches = list(self.batch_sampler)
        for indices in batches[skip:]:
            yield self.collate_fn([self.dataset[i] for i in indices])


def repair_batch_error(blocks: int, batch_size: int, world_size: int) -> str:
    """Why ``blocks`` training blocks give the block-wise repair no step (a global batch of
    ``batch_size`` × ``world_size`` is more than they hold)."""
    return (
        f"distill.blockwise_passes: {blocks} training blocks do not fill one global batch of "
        f"{batch_size} × {world_size} ranks; use more data or a smaller data.batch_size"
    )


class FullBatchShare(Sampler[int]):
    """This rank's share of every full global batch of an epoch's permutation (``seed + epoch``,
    as ``loaders.EpochSampler`` draws it): step i's global batch is the permutation's i-th run of
    ``batch_size × world_size`` blocks, and rank r takes its r-th ``batch_size``. One process with
    the global batch size draws the very same batches; the last, partial one is left out (a
    different one each epoch), so no rank repeats a block or waits for a batch the others lack.
    ``max_steps`` keeps only the first batches of each epoch (a different share each epoch)."""

    def __init__(
        self,
        blocks: int,
        batch_size: int,
        world_size: int,
        rank: int,
        seed: int,
        max_steps: int | None = None,
    ):
        self.blocks, self.batch_size, self.rank, self.seed = blocks, batch_size, rank, seed
        self.world_size, self.epoch = world_size, 0
        full = blocks // (batch_size * world_size)
        self.steps = full if max_steps is None else min(full, max_steps)
        if self.steps == 0:
            raise DataError(repair_batch_error(blocks, batch_size, world_size))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.steps * self.batch_size

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.blocks, generator=generator).tolist()
        width = self.batch_size * self.world_size
        for step in range(self.steps):
            first = step * width + self.rank * self.batch_size
            yield from order[first : first + self.batch_size]


def sharded_loader(
    loader: DataLoader, world_size: int, rank: int, max_steps: int | None = None
) -> DataLoader:
    """``loader``'s blocks, batch size and collation, sampled by :class:`FullBatchShare`."""
    seed = getattr(loader.sampler, "seed", 0)
    # The real blocks only: a RankShare's dataset ends in the ranks' unscored padding.
    blocks = getattr(loader.sampler, "blocks", len(loader.dataset))
    sampler = FullBatchShare(blocks, loader.batch_size, world_size, rank, seed, max_steps)
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size, sampler=sampler, collate_fn=loader.collate_fn
    )


def passes_over(
    loader: DataLoader, passes: int, device: torch.device, ended: int = 0, into: int = 0
) -> Iterator[Iterator[dict[str, Tensor]]]:
    """``passes`` iterations of ``loader`` (its sampler's epoch set to each pass's number), each
    batch's tensors moved to ``device``; a resumed repair's from its pass ``ended`` on (the
    passes it ended left out), that pass from its batch ``into`` (all of it read: none)."""
    for number in range(ended, passes):
        loader.sampler.set_epoch(number)
        skip = into if number == ended else 0
        left = iter(()) if skip >= len(loader) else islice(loader, skip, None)
        yield (on_device(batch, device) for batch in left)


def on_device(batch: dict[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}


def already_trained(trainer) -> int:
    """Batches of the current epoch a resumed run has trained on (0 unless resuming; None: no
    trainer).

    Read from Lightning's own loop progress, restored from the checkpoint: the one count that
    knows what was trained, whatever the data fetcher had prefetched when it was saved.
    """
    if trainer is None:
        return 0
    done = resumed_batches_in_epoch(trainer)
    return 0 if done >= trainer.num_training_batches else done


def ranks(trainer) -> tuple[int, int]:
    """This process's rank and the number of ranks (0 of 1 outside a trainer)."""
    return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
