"""A model file its library cannot read is named, with the library's reason and the fix."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from transformers import GPT2Config, GPT2LMHeadModel

from lightning_kd.evaluation.saved_models import load_model
from lightning_kd.models.loading import TeacherSpec, byte_tokenizer, load_teacher
from lightning_kd.models.unreadable import UnreadableModel


def saved_gpt2(path: Path) -> Path:
    """A tiny GPT-2 and its tokenizer, saved as save_pretrained writes them (safetensors)."""
    config = GPT2Config(vocab_size=257, n_embd=16, n_layer=1, n_head=2, n_positions=32)
    GPT2LMHeadModel(config).save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def test_a_damaged_safetensors_file_is_named_with_the_fix(tmp_path: Path) -> None:
    path = saved_gpt2(tmp_path / "teacher")
    (path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(UnreadableModel) as error:
        load_teacher(TeacherSpec(path=str(path), dtype="float32"))
    message = str(error.value)
    assert f"cannot read the teacher at {path / 'model.safetensors'}" in message
    assert "deserializing header" in message and "re-download it" in message
    assert isinstance(error.value.__cause__, SafetensorError)


def test_a_truncated_gguf_file_is_named_with_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTNING_KD_CACHE", str(tmp_path / "cache"))
    # A GGUF header that promises 10 tensors and 5 metadata entries, cut off after 2 bytes.
    header = b"GGUF" + struct.pack("<IQQ", 3, 10, 5) + b"\x01\x00"
    (tmp_path / "teacher.gguf").write_bytes(header)
    with pytest.raises(UnreadableModel) as error:
        load_teacher(TeacherSpec(path=str(tmp_path), gguf_file="teacher.gguf"))
    message = str(error.value)
    assert f"cannot read the GGUF file at {tmp_path / 'teacher.gguf'}" in message
    assert "unpack_from requires a buffer" in message and "truncated or damaged" in message
    assert isinstance(error.value.__cause__, struct.error)
    assert not list((tmp_path / "cache").glob("teacher-*/config.json"))  # nothing half-converted


class NotAWeight:
    """A pickled object torch's weights-only unpickler refuses to build."""


def test_a_pickle_that_weights_only_loading_refuses_is_named_with_the_fix(tmp_path) -> None:
    path = saved_gpt2(tmp_path / "student")
    state = GPT2LMHeadModel.from_pretrained(path).state_dict()
    (path / "model.safetensors").unlink()
    torch.save({**state, "extra": NotAWeight()}, path / "pytorch_model.bin")
    with pytest.raises(UnreadableModel) as error:
        load_model(str(path))
    message = str(error.value)
    assert (
        f"cannot read {path} at {path / 'pytorch_model.bin'}: Weights only load failed" in message
    )
    assert "convert it to safetensors" in message
    assert isinstance(error.value.__cause__, pickle.UnpicklingError)


def test_a_checkpoint_without_weights_the_model_needs_is_refused_wherever_it_loads(
    tmp_path: Path, capsys
) -> None:
    """The body of a GPT-2 saved without its LM head and with its head untied: loaded as a
    teacher, a student or an evaluated model, the head started at random (a log line said so)."""
    from lightning_kd.cli import main
    from lightning_kd.models.unreadable import IncompleteModel

    config = GPT2Config(
        vocab_size=257, n_embd=16, n_layer=1, n_head=2, n_positions=32, tie_word_embeddings=False
    )
    path = tmp_path / "headless"
    GPT2LMHeadModel(config).transformer.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    with pytest.raises(IncompleteModel, match=r"lacks 1 weight\(s\) .*\(lm_head.weight\)"):
        load_teacher(TeacherSpec(path=str(path), dtype="float32"))
    with pytest.raises(IncompleteModel, match=f"^{path} lacks 1 weight.* saved whole"):
        load_model(str(path))
    text = tmp_path / "a.txt"
    text.write_text("some held-out text to score")
    assert main(["evaluate", "--block-size", "16", "--files", str(text), "--", str(path)]) == 2
    err = capsys.readouterr().err
    assert "lm_head.weight" in err and "Traceback" not in err


def test_a_damaged_model_given_to_a_command_is_refused_without_a_traceback(tmp_path, capsys):
    from lightning_kd.cli import main

    path = saved_gpt2(tmp_path / "student")
    (path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    text = tmp_path / "a.txt"
    text.write_text("some held-out text to score")
    assert main(["evaluate", "--block-size", "16", "--files", str(text), "--", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "re-download it" in err and "Traceback" not in err


def test_a_config_cut_short_is_named_with_the_fix(tmp_path) -> None:
    """transformers' "is not a valid JSON file" came without the fix a damaged weights or
    tokenizer file gets (probe 59)."""
    from lightning_kd.models.positions import saved_positions
    from lightning_kd.models.unreadable import UnreadableModel

    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden')
    with pytest.raises(UnreadableModel, match=r"config.json: .*the file is damaged or incomplete"):
        saved_positions(str(tmp_path))
