"""Training-order samplers and loaders: the same batches on every run, rank count and resume.

``EpochSampler`` draws one seeded permutation per epoch (the one ``DistributedSampler`` draws, so
N ranks together see the batches one process sees); ``ResumableLoader`` starts a resumed epoch
where the interrupted one stopped, without collating the batches it skips.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader, RandomSampler


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


class ResumableLoader(DataLoader):
    """A DataLoader that starts an iteration ``skip_batches()`` batches in.

    After a mid-epoch resume, that is the number of batches the interrupted epoch had trained on;
    the skipped batches are never collated.
    """

    def __init__(self, *args, skip_batches: Callable[[], int] | None = None, **kwargs) -> None:
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
