"""What a ``data.dataset`` split must hold: rows, and the columns read
(``data/dataset_columns.py``)."""

from __future__ import annotations

from lightning_kd.data.dataset_columns import source_errors
from lightning_kd.data.dataset_source import DatasetSource
from lightning_kd.data.text import TextDataModule


def test_splits_naming_their_column_differently_are_told_one_setting_reads_both(
    tmp_path, datasets_home
) -> None:
    """Told "set data.text_field", a user who did was refused for the other split (probe 46)."""
    import datasets

    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a document. " * 4] * 3}),
            "validation": datasets.Dataset.from_dict({"content": ["held out. " * 4] * 3}),
        }
    )
    splits.save_to_disk(tmp_path / "saved")
    source = DatasetSource.of({"path": str(tmp_path / "saved"), "val_split": "validation"})
    columns = TextDataModule.dataset_columns({"text_field": "text"})
    (error,) = source_errors(source, columns)
    assert error.startswith(f"{source.describe('validation')} has no column 'text'; its columns:")
    assert error.endswith(
        "; split 'train' has them, and data.text_field names them in both splits: rename the "
        "column in one to match (e.g. datasets' rename_column)"
    )
    assert "set data.text_field" not in error
    (alone,) = source_errors(
        DatasetSource.of({"path": str(tmp_path / "saved")}),
        TextDataModule.dataset_columns({"text_field": "content"}),
    )
    assert alone.endswith("set data.text_field=text, the column of text there")  # one split read
