"""The fix for a ``data.dataset`` that cannot be opened, where its cause is a common one
(``data/dataset_hints.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_kd.data.dataset_source import DatasetSource, open_split
from lightning_kd.utils.refusal import Refused


def test_a_datasets_cache_under_a_file_names_hf_datasets_cache(
    tmp_path, datasets_home, monkeypatch
) -> None:
    """NotADirectoryError was told to set data.dataset.path (probe 48)."""
    import datasets

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(tmp_path / "a_file" / "ds"))
    source = DatasetSource.of({"path": "json", "data_files": str(rows)})
    with pytest.raises(Refused) as refused:
        open_split(source, "train", streaming=False)
    message = str(refused.value)
    assert "datasets cannot write its cache (Not a directory" in message
    assert message.endswith("set HF_DATASETS_CACHE to a directory you can write")
