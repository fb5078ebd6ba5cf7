"""How a streamed split divides among ranks: whole files only where the ranks' shares are alike
in size, else every N-th row, so that a short file is not looped by its rank while a long one is
read once; a resumed run splits as its checkpoint did."""

from __future__ import annotations

from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.stream_shares import alike, strategy_for
from tests.unit.data.test_datasets import write_parquet
from tests.unit.data.test_streaming import streamed


def files(tmp_path, *rows: int) -> list[str]:
    """Parquet files of ``rows[i]`` rows each, row j of file i reading ``"<i> <j> xxxx"``."""
    paths = []
    for i, count in enumerate(rows):
        texts = [{"text": f"{i} {j:03d} " + "x" * 40} for j in range(count)]
        paths.append(str(write_parquet(tmp_path / f"f{i}.parquet", texts)))
    return paths


def shares(data, world_size: int = 2) -> list[list[str]]:
    return [[row["text"][:5] for row in data.stream.share(rank, world_size)] for rank in (0, 1)]


def test_files_of_very_different_sizes_are_split_row_by_row(tmp_path, datasets_home) -> None:
    paths = files(tmp_path, 60, 6)
    data = streamed({"path": "parquet", "data_files": paths}, val_size=1)
    first, second = shares(data)
    assert data.stream.strategy == "examples"
    assert abs(len(first) - len(second)) <= 1  # not 60 against 6
    assert {text[0] for text in first} == {text[0] for text in second} == {"0", "1"}
    assert sorted(first + second) == sorted(
        f"{i} {j:03d}" for i, n in ((0, 60), (1, 6)) for j in range(n)
    )
    assert data.state_dict()["stream_split"] == "examples"


def test_files_alike_in_size_are_split_whole(tmp_path, datasets_home) -> None:
    data = streamed({"path": "parquet", "data_files": files(tmp_path, 30, 30)}, val_size=1)
    first, second = shares(data)
    assert data.stream.strategy == "shards"
    assert {text[0] for text in first} == {"0"} and {text[0] for text in second} == {"1"}


def test_a_resume_splits_as_its_checkpoint_did(tmp_path, datasets_home) -> None:
    """A checkpoint from before the split was chosen by size (no ``stream_split``) was split
    whole where the file count divided: its positions mean rows of those shares."""
    data = streamed({"path": "parquet", "data_files": files(tmp_path, 60, 6)}, val_size=1)
    cursors = data.state_dict()["stream_cursors"] * 2
    data.stream.load_state_dict({"stream_cursors": cursors}, 1, 2)
    assert data.stream.strategy == "auto"
    assert {text[0] for text in shares(data)[1]} == {"1"}
    data.stream.load_state_dict({"stream_cursors": cursors, "stream_split": "examples"}, 1, 2)
    assert data.stream.strategy == "examples"


def test_the_ranks_shares_of_bytes_decide() -> None:
    assert alike([100, 100, 100, 96], 2)  # 200 against 196
    assert not alike([100, 100, 100, 20], 2)
    assert alike([100, 3, 3, 100], 2)  # rank 0: files 0 and 2, rank 1: files 1 and 3


def test_data_whose_sizes_are_not_known_here(tmp_path) -> None:
    hub = DatasetSource.of({"path": "some-org/some-corpus"})
    assert strategy_for(hub, "train", 4, 2) == "auto"  # the hub's shards are written alike
    folder = tmp_path / "corpus"
    folder.mkdir()
    local = DatasetSource.of({"path": str(folder)})
    assert strategy_for(local, "train", 2, 2) == "examples"  # no file found to weigh
    assert strategy_for(local, "train", 2, 1) == "auto"  # one process reads it all
