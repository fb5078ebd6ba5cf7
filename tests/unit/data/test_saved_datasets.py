"""A ``save_to_disk`` folder as ``data.dataset.path``: a split dict opened a split at a time, so
that a split saved with no row is refused only where it is read (``data/saved_datasets.py``)."""

from __future__ import annotations

import warnings

import pytest

from lightning_kd.data.dataset_source import DatasetSource, open_split, open_split_names
from lightning_kd.utils.refusal import Refused


def saved(tmp_path, datasets_home, **rows: int) -> str:
    """A DatasetDict of ``rows[split]`` documents per split, saved; its folder."""
    import datasets

    splits = datasets.DatasetDict(
        {
            name: datasets.Dataset.from_dict({"text": [f"{name} {i} " * 4 for i in range(n)]})
            for name, n in rows.items()
        }
    )
    splits.save_to_disk(tmp_path / "saved")
    return str(tmp_path / "saved")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_split_dict_with_an_empty_split_reads_its_other_splits(
    tmp_path, datasets_home, streaming
) -> None:
    """load_from_disk cannot open it whole (IndexError), and the run was refused as a
    data.dataset.path that "cannot be opened here" though train was whole (probe 46). The empty
    split is offered for nothing: validating on it would be refused."""
    path = saved(tmp_path, datasets_home, train=12, validation=0, test=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "validation goes unread": it holds no row
        train = open_split(DatasetSource.of({"path": path}), "train", streaming=streaming)
    assert sorted(row["text"] for row in train)[0] == "train 0 train 0 train 0 train 0 "
    assert len(list(train)) == 12
    assert open_split_names(DatasetSource.of({"path": path})) == ["train", "validation", "test"]


def test_reading_the_empty_split_is_refused_naming_it(tmp_path, datasets_home) -> None:
    path = saved(tmp_path, datasets_home, train=12, validation=0)
    source = DatasetSource.of({"path": path, "val_split": "validation"})
    with pytest.raises(Refused, match=r"split 'validation' was saved with no row .*save it with"):
        open_split(source, "validation", streaming=False)


def test_a_split_the_dict_lacks_is_refused_with_the_splits_it_has(tmp_path, datasets_home) -> None:
    path = saved(tmp_path, datasets_home, train=12, test=3)
    with pytest.raises(Refused, match=r"has no split 'dev'; its splits: \['train', 'test'\]"):
        open_split(DatasetSource.of({"path": path, "split": "dev"}), "dev", streaming=False)
