"""``student.config`` / ``teacher.config`` built through the config class, every key checked."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, GPT2Config, LlamaConfig

from lightning_kd.models.loading import model_from_config
from lightning_kd.models.model_config import config_from

BASE = LlamaConfig(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def test_a_key_the_config_does_not_have_is_named_with_the_nearest() -> None:
    """Set as attributes, both keys were kept and read by nothing: a full-size student."""
    config, errors = config_from({"num_layers": 1, "hidden_sise": 32}, BASE, "student.config")
    assert config is None
    assert errors == [
        "student.config.hidden_sise: a llama config has no key 'hidden_sise'; did you mean "
        "student.config.hidden_size?",
        "student.config.num_layers: a llama config has no key 'num_layers'; did you mean "
        "student.config.num_hidden_layers?",
    ]


def test_keys_take_effect_as_the_config_class_reads_them() -> None:
    config, errors = config_from({"num_hidden_layers": 2, "rope_theta": 1e5}, BASE, "s")
    assert errors == [] and config.num_hidden_layers == 2 and config.hidden_size == 64
    assert config.rope_parameters["rope_theta"] == 1e5  # an attribute alone changed nothing
    other, errors = config_from({"model_type": "gpt2", "n_layer": 1, "n_embd": 32}, BASE, "s")
    assert errors == [] and isinstance(other, GPT2Config)  # was a Llama with a model_type
    assert other.n_layer == 1 and other.vocab_size == 257  # the tokenizer's side is the base's


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_attention_heads": 3}, "hidden size (64) is not a multiple of the number of"),
        ({"num_attention_heads": 6, "hidden_size": 96, "num_key_value_heads": 4}, "multiple of"),
        ({"model_type": "lama"}, "model_type='lama' is not a transformers model type; did you"),
    ],
)
def test_a_config_that_cannot_build_a_model_is_refused(overrides, message) -> None:
    config, errors = config_from(overrides, BASE, "student.config")
    assert config is None and message in errors[0]


def test_a_model_from_a_bad_config_is_refused_before_it_is_built() -> None:
    with pytest.raises(ValueError, match="teacher.config needs model_type"):
        model_from_config({"hidden_size": 8}, "causal_lm")
    with pytest.raises(ValueError, match="teacher.config.n_layr: a gpt2 config has no key"):
        model_from_config({"model_type": "gpt2", "n_layr": 1}, "causal_lm")


@pytest.mark.parametrize("model_type", ["gemma3_text", "qwen2", "smollm3"])
def test_a_student_of_another_depth_gets_per_layer_lists_of_its_own(model_type: str) -> None:
    """``student.config={num_hidden_layers: 2}`` over a teacher whose config lists a value per
    layer (Gemma 3, Qwen 2/3, SmolLM3: every real checkpoint's) was refused: "must be equal to
    the number of layer_types (6)" (probe 31). The class derives them for the new depth; a list
    given with the depth is still checked."""
    small = {"vocab_size": 257, "hidden_size": 64, "intermediate_size": 128}
    small |= {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2}
    teacher = AutoConfig.for_model(model_type, **small)
    assert len(teacher.layer_types) == 6
    config, errors = config_from({"num_hidden_layers": 2}, teacher, "student.config")
    assert errors == [] and config.num_hidden_layers == 2 and len(config.layer_types) == 2
    wrong = {"num_hidden_layers": 2, "layer_types": ["full_attention"] * 3}
    _, errors = config_from(wrong, teacher, "student.config")
    assert errors and "layer_types" in errors[0]
