"""The processes of a run compare their configs before the first stage's collectives."""

from __future__ import annotations

from omegaconf import OmegaConf

from lightning_kd.training.same_config import (
    config_differences,
    flat_settings,
    lock_view,
    same_config_error,
    unshared_error,
)


def test_settings_are_flat_and_resolved() -> None:
    cfg = OmegaConf.create({"seed": 3, "data": {"seed": "${seed}", "files": ["a.txt", "b.txt"]}})
    assert flat_settings(cfg) == {
        "seed": "3",
        "data.seed": "3",
        "data.files": '["a.txt", "b.txt"]',
    }


def test_each_setting_a_process_does_not_share_with_process_0_is_named() -> None:
    zero = {"seed": "0", "data.files": "null", "data.max_train_examples": "180"}
    other = {"seed": "1", "data.files": '["c.txt"]', "data.max_train_examples": "180"}
    assert config_differences([zero, dict(zero), other]) == [
        "seed: process 0 has 0, process 2 1",
        'data.files: process 0 has null, process 2 ["c.txt"]',
    ]
    assert config_differences([zero, dict(zero)]) == []
    many = [{f"k{i}": "0" for i in range(7)}, {f"k{i}": "1" for i in range(7)}]
    assert config_differences(many)[-1] == "and 3 more"
    assert config_differences([zero, {**zero, "extra": "1"}]) == [
        "extra: process 0 has (not set), process 1 1"
    ]


def test_one_process_compares_nothing() -> None:
    assert same_config_error({"seed": "0"}, world_size=1, role="the run") is None


def test_a_process_that_does_not_see_process_0s_run_directory_is_named(tmp_path) -> None:
    """The same hydra.run.dir on each node's own disk: node 1 trained and wrote nothing, and
    its resume was refused (no checkpoint) while node 0 waited for it in silence."""
    lock = tmp_path / ".lock"
    lock.write_text("4242")
    error = unshared_error([lock_view(lock), "4242", None, "17"], lock)
    assert error.startswith(f"process(es) 2, 3 do not see process 0's run directory {tmp_path}")
    assert "hydra.run.dir must be on a filesystem every node shares" in error
    assert unshared_error([lock_view(lock), "4242"], lock) is None
