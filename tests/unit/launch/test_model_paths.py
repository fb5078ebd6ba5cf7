"""``model_path_errors``: the model paths a run reads, checked before anything loads."""

from __future__ import annotations

from omegaconf import OmegaConf

from lightning_kd.launch.model_paths import model_path_errors, path_error


def test_packaged_names_hub_ids_and_missing_keys_pass(tmp_path):
    cfg = OmegaConf.create({"teacher": {"path": "smollm2"}, "student": {"path": "org/name"}})
    assert model_path_errors(cfg) == []
    assert model_path_errors(OmegaConf.create({})) == []
    assert path_error("teacher", None) is None


def test_each_unreadable_path_is_named_by_its_key(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cfg = OmegaConf.create(
        {
            "teacher": {"path": str(tmp_path / "model"), "gguf_file": "m.gguf"},
            "student": {"path": str(tmp_path / "model")},
            "teachers": [{"name": "a", "weight": 0.5}, {"name": "b", "path": "./typo"}],
        }
    )
    errors = model_path_errors(cfg)
    assert errors == [
        f"teacher.gguf_file: {tmp_path}/model/m.gguf does not exist",
        errors[1],
    ]
    assert errors[1].startswith("teachers[1].path=./typo does not exist; give an existing model")
