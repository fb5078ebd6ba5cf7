"""The model settings of ``train`` refused with the config, before any model loads (each was a
traceback once the teacher had loaded)."""

from __future__ import annotations

import pytest

from lightning_kd.launch.config import compose_config
from lightning_kd.launch.model_checks import model_setting_errors

PAIR = "{student: model.layers.0, teacher: model.layers.1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("distill.features=unifrom", "distill.features='unifrom': did you mean 'uniform'?"),
        (f"distill.features=[{PAIR}, wieght: 2}}]", "takes no key 'wieght'; did you mean weight?"),
        (f"distill.features=[{PAIR}, loss: kl}}]", "distill.features[0]: unknown feature loss"),
        (f"distill.features=[{PAIR}, weight: -1}}]", "weight must be >= 0"),
        ("distill.feature_loss=bogus", "distill.feature_loss / feature_weight: unknown feature"),
        ("distill.projector=bogus", "distill.projector='bogus': choose one of ['linear', 'none']"),
        ("student.num_layers=5", "student.num_layers=5 is larger than the teacher's 4 layers"),
        ("student.layers=[0,9]", "student.layers has indices [9] outside the teacher's 0..3"),
        ("student.freeze_layers=2", "student.freeze_layers=2 would freeze all 2 of the student"),
        ("student.layers=imp", "give teacher layer indices ([0,15,29]) or 'importance'"),
        ("student.lora={r: 0}", "student.lora.r=0: an integer >= 1"),
        # probe 36: a TypeError's repr; and, once the models had loaded, "q_proj" nearest q_proj
        ("student.lora={alpha: abc}", "student.lora.alpha='abc': must be a number > 0"),
        ("student.lora={target_modules: q_proj}", "give a list: student.lora.target_modules=[q"),
        ("student.config={hidden_sise: 32}", "did you mean student.config.hidden_size?"),
        ("+teacher.config.n_layers=2", "teacher.config.n_layers: a llama config has no key"),
        (  # refused at the first batch, once both models had loaded
            "distill.features=[{student: lm_head, teacher: model.layers.1}]",
            "the student module 'lm_head' is the output head, which never runs",
        ),
    ],
)
def test_a_model_setting_the_run_would_refuse_is_refused_with_the_config(override, message):
    errors = model_setting_errors(compose_config(["debug=smoke", override]))
    assert len(errors) == 1 and message in errors[0], errors


def test_the_shipped_configs_pass() -> None:
    for overrides in ([], ["debug=smoke"], ["debug=smoke", "student.layers=importance"]):
        assert model_setting_errors(compose_config(overrides)) == []


BERT = "{model_type: bert, vocab_size: 257, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 64}"  # noqa: E501
T5 = "{model_type: t5, vocab_size: 257, d_model: 32, num_layers: 2, num_heads: 4, d_ff: 64}"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # BertLMHeadModel trained to exit 0 with attention both ways (distill.chunked=false)
        (
            ["~teacher.config", f"+teacher.config={BERT}"],
            "teacher.config: a bert model reads its text both ways",
        ),
        ([f"student.config={BERT}"], "student.config: a bert model reads its text both ways"),
        # a transformers traceback listing several hundred classes
        (
            ["~teacher.config", f"+teacher.config={T5}"],
            "teacher.config: an encoder-decoder model (t5) is not",
        ),
    ],
)
def test_a_model_that_is_no_causal_lm_is_refused_before_it_loads(overrides, message) -> None:
    errors = model_setting_errors(compose_config(["debug=smoke", *overrides]))
    assert len(errors) == 1 and message in errors[0], errors
    encoder = ["debug=smoke", "~teacher.config", f"+teacher.config={BERT}", "teacher.task=encoder"]
    assert model_setting_errors(compose_config(encoder)) == []


def test_a_moved_layer_scaled_by_its_index_is_refused_before_it_loads() -> None:
    gpt2 = "{model_type: gpt2, vocab_size: 257, n_embd: 32, n_layer: 4, n_head: 4, scale_attn_by_inverse_layer_idx: true}"  # noqa: E501
    swap = ["debug=smoke", "~teacher.config", f"+teacher.config={gpt2}"]
    errors = model_setting_errors(compose_config(swap))
    assert len(errors) == 1 and "teacher layer 3 as student layer 1" in errors[0], errors


def test_layers_out_of_teacher_order_are_named_by_the_setting_that_reads_spans() -> None:
    """``student.layers=[3,1]`` with the block-wise repair was refused once the models had
    loaded, as ``distill.features=spans`` needing them in order, with the advice to use
    uniform features, which did not help (probe 36). Uniform features alone train them."""
    layers = ["debug=smoke", "student.layers=[3,1]"]
    repair = model_setting_errors(
        compose_config([*layers, "distill.features=null", "distill.blockwise_passes=1"])
    )
    assert repair == [
        "distill.blockwise_passes needs student layers copied in teacher order (each stands for "
        "the teacher layers up to the next one's); student.layers=[3, 1] is not increasing: sort "
        "it, or set distill.blockwise_passes=0 (no block-wise repair)"
    ]
    spans = model_setting_errors(compose_config([*layers, "distill.features=spans"]))
    assert len(spans) == 1 and spans[0].startswith("distill.features=spans needs"), spans
    assert "use distill.features=uniform, or list the pairs" in spans[0]
    assert model_setting_errors(compose_config([*layers, "distill.features=uniform"])) == []


def test_a_copied_students_depth_is_named_with_the_other_problems() -> None:
    overrides = ["debug=smoke", "distill.features=unifrom", "student.num_layers=5"]
    errors = model_setting_errors(compose_config(overrides))
    assert len(errors) == 2 and "did you mean 'uniform'?" in errors[0], errors
    assert "student.num_layers=5 is larger than the teacher's 4 layers" in errors[1], errors


def test_a_head_pair_runs_where_the_step_runs_the_head() -> None:
    head = "distill.features=[{student: lm_head, teacher: lm_head}]"
    assert (
        model_setting_errors(compose_config(["debug=smoke", head, "distill.chunked=false"])) == []
    )


def test_activation_checkpointing_on_a_family_without_it_is_refused_before_it_loads() -> None:
    """openai-gpt, ctrl, xlnet, ...: transformers' ValueError once the models had loaded, exit 1
    (probe 45)."""
    gpt1 = "{model_type: openai-gpt, vocab_size: 257, n_embd: 32, n_layer: 4, n_head: 4}"
    teacher = ["debug=smoke", "~teacher.config", f"+teacher.config={gpt1}"]
    on = [*teacher, "student.activation_checkpointing=true"]
    errors = model_setting_errors(compose_config(on))
    assert errors == [
        "student.activation_checkpointing=true: OpenAIGPTLMHeadModel (openai-gpt) has no "
        "activation checkpointing in transformers; set student.activation_checkpointing=false"
    ]
    assert model_setting_errors(compose_config(teacher)) == []
    llama = model_setting_errors(
        compose_config(["debug=smoke", "student.activation_checkpointing=true"])
    )
    assert llama == []


def test_a_repair_of_no_layer_is_refused_before_anything_loads() -> None:
    """Refused at the repair, distill.teacher_cache=auto had counted its passes and written a
    cache for them (verify 57): the configs tell it first."""
    cases = {
        ("student.num_layers=2", "student.freeze_layers=1"): "['student layer 0'] each stand for",
        ("student.layers=[0,1,2,3]",): "each copies one teacher layer as it is, none stands",
    }
    for overrides, message in cases.items():
        cfg = compose_config(["debug=smoke", "distill.blockwise_passes=2", *overrides])
        errors = model_setting_errors(cfg)
        assert len(errors) == 1 and message in errors[0], errors
    repairs = ["debug=smoke", "distill.blockwise_passes=2", "student.layers=[0,2]"]
    assert model_setting_errors(compose_config([*repairs, "student.freeze_layers=1"])) == []
