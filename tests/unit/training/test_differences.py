"""A checkpoint's record against a resuming run's: each difference by the key a user sets."""

from __future__ import annotations

from lightning_kd.training.differences import differences


def teacher(**changed) -> dict:
    record = {"path": "smollm2", "weights": "w1", "config": "c1", "records": "full"}
    return {"teacher": record | changed}


def test_the_teachers_path_is_shown_only_beside_another_model() -> None:
    """Beside a difference of teacher.records alone it printed "teacher.path: checkpoint
    'smollm2', this run 'smollm2'", as if the path differed (probe 58)."""
    assert differences(teacher(records="top 256"), teacher()) == [
        "teacher.records: checkpoint 'top 256', this run 'full'"
    ]
    assert differences(teacher(weights="w0"), teacher()) == [
        "teacher.weights: checkpoint 'w0', this run 'w1'",
        "teacher.path: 'smollm2' in both: the model there is another now",
    ]
    assert differences(teacher(weights="w0", path="/old"), teacher())[-1] == (
        "teacher.path: checkpoint '/old', this run 'smollm2'"
    )
    assert differences(teacher(path="/old"), teacher()) == []  # a moved copy of the same model
