"""What train refuses before anything loads: the same list checks each job of a sweep."""

from __future__ import annotations

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.train_checks import train_errors, train_job_errors


def test_names_files_and_models_are_checked_not_the_numbers_alone(tmp_path) -> None:
    """A sweep's jobs were checked by their numbers (config_errors): a misspelt feature loss
    or a missing data file was found once the jobs before it had trained (probe 37)."""
    missing = tmp_path / "none.jsonl"
    overrides = ["debug=smoke", "distill.feature_loss=cosin", f"data.files=[{missing}]"]
    cfg = compose_config(overrides, output_dir=str(tmp_path / "run"))
    errors = train_errors(cfg)
    assert any("unknown feature loss 'cosin'" in error for error in errors), errors
    assert f"data.files entry '{missing}' does not exist" in errors, errors
    assert train_job_errors(cfg, here=True) == errors
    # A job a cluster runs: what the config says alone (the files are the cluster's to find).
    queued = train_job_errors(cfg, here=False)
    assert any("unknown feature loss 'cosin'" in error for error in queued), queued
    assert not any("does not exist" in error for error in queued), queued
    assert train_errors(compose_config(["debug=smoke"], output_dir=str(tmp_path / "ok"))) == []
