"""Layer pairs from config, projectors, and feature losses."""

from __future__ import annotations

import pytest
import torch

from lightning_kd.losses.features import cosine, get_feature_loss, masked_feature_sum, mse
from lightning_kd.models.capture import ModuleChoiceError
from lightning_kd.models.layer_pairs import (
    LayerPair,
    layer_pairs,
    make_projectors,
    span_ends,
    span_order_error,
)
from lightning_kd.models.loading import StudentSpec, load_teacher
from lightning_kd.models.student import build_student
from lightning_kd.utils.refusal import Refused


@pytest.fixture
def pair_of_models(tiny_teacher):
    teacher = load_teacher(tiny_teacher)
    return build_student(StudentSpec(num_layers=2), teacher, "causal_lm"), teacher


def test_uniform_maps_student_layers_to_their_source_layers(pair_of_models) -> None:
    models, teacher = pair_of_models
    pairs = layer_pairs("uniform", models.student, teacher, models.layer_map, "mse", 0.5)
    assert pairs == [
        LayerPair("model.layers.0", "model.layers.0", "mse", 0.5),
        LayerPair("model.layers.1", "model.layers.3", "mse", 0.5),
    ]


def test_uniform_without_layer_map_spreads_evenly(tiny_teacher) -> None:
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(config={"num_hidden_layers": 2}), teacher, "causal_lm")
    pairs = layer_pairs("uniform", student.student, teacher, None)
    assert [p.teacher for p in pairs] == ["model.layers.0", "model.layers.3"]


def test_spans_map_each_student_layer_to_the_end_of_its_span(tiny_teacher) -> None:
    teacher = load_teacher(tiny_teacher)
    models = build_student(StudentSpec(layers=[0, 2, 3]), teacher, "causal_lm")
    pairs = layer_pairs("spans", models.student, teacher, models.layer_map, "mse", 0.5)
    # Student layer 0 stands for teacher layers 0-1 (layer 1 copies teacher 2, which reads teacher
    # 1's output), layer 1 for teacher 2, the last for the teacher's last.
    assert pairs == [
        LayerPair("model.layers.0", "model.layers.1", "mse", 0.5),
        LayerPair("model.layers.1", "model.layers.2", "mse", 0.5),
        LayerPair("model.layers.2", "model.layers.3", "mse", 0.5),
    ]
    spans = "distill.features=spans"
    assert span_ends([0, 6, 12, 17, 23, 29], 30, spans) == [5, 11, 16, 22, 28, 29]
    assert span_ends([0, 1, 8, 11, 28, 29], 30, spans) == [0, 7, 10, 27, 28, 29]


def test_spans_refuse_layers_out_of_teacher_order(tiny_teacher) -> None:
    teacher = load_teacher(tiny_teacher)
    models = build_student(StudentSpec(layers=[3, 1]), teacher, "causal_lm")
    with pytest.raises(Refused, match=r"student.layers=\[3, 1\] is not increasing"):
        layer_pairs("spans", models.student, teacher, models.layer_map)
    with pytest.raises(ValueError, match="use 'uniform', 'spans' or a list of pairs"):
        layer_pairs("even", models.student, teacher, models.layer_map)
    # A repeated layer was told to "sort it", which it already is (probe 45).
    repeated = span_order_error([0, 1, 1, 3], "distill.features=spans")
    assert "not increasing: teacher layer(s) [1] are copied twice" in repeated
    assert "sort it" not in repeated


def test_spans_refuse_a_random_student_deeper_than_the_teacher(tiny_teacher) -> None:
    """Evenly spread, teacher layers stood for two student layers each, and the refusal said
    the layers were not copied in teacher order, of a student copied from nothing."""
    teacher = load_teacher(tiny_teacher)
    student = build_student(StudentSpec(config={"num_hidden_layers": 6}), teacher, "causal_lm")
    with pytest.raises(
        Refused,
        match="this student was not copied and has 6 layers against the "
        "teacher's 4: use distill.features=uniform",
    ):
        layer_pairs("spans", student.student, teacher, None)


def test_explicit_pairs_keep_config_order_and_defaults(pair_of_models) -> None:
    models, teacher = pair_of_models
    config = [
        {"student": "model.layers.1.mlp", "teacher": "model.layers.2.mlp", "weight": 2.0},
        {"student": "model.norm", "teacher": "model.norm", "loss": "mse"},
    ]
    pairs = layer_pairs(config, models.student, teacher, None, "cosine", 1.0)
    assert pairs == [
        LayerPair("model.layers.1.mlp", "model.layers.2.mlp", "cosine", 2.0),
        LayerPair("model.norm", "model.norm", "mse", 1.0),
    ]


def test_bad_pairs_are_errors(pair_of_models) -> None:
    models, teacher = pair_of_models
    # A Refused (exit 2 with the message) that is still a CaptureError for library callers.
    with pytest.raises(ModuleChoiceError, match=r"student \(LlamaForCausalLM\) has no module"):
        layer_pairs(
            [{"student": "model.layer.0", "teacher": "model.layers.0"}],
            models.student,
            teacher,
            None,
        )
    with pytest.raises(ValueError, match="needs keys student and teacher"):
        layer_pairs([{"student": "model.norm"}], models.student, teacher, None)
    with pytest.raises(ValueError, match="unknown feature loss 'kl'"):
        layer_pairs(
            [{"student": "model.norm", "teacher": "model.norm", "loss": "kl"}],
            models.student,
            teacher,
            None,
        )
    with pytest.raises(ValueError, match="distill.features='all'"):
        layer_pairs("all", models.student, teacher, None)


def test_projectors_only_where_widths_differ(pair_of_models) -> None:
    models, teacher = pair_of_models
    pairs = [
        LayerPair("model.layers.0", "model.layers.0"),
        LayerPair("model.layers.0.mlp.up_proj", "model.layers.1"),  # 64 wide -> 32 wide
    ]
    projectors = make_projectors(pairs, models.student, teacher, "linear")
    assert isinstance(projectors[0], torch.nn.Identity)
    assert projectors[1].in_features == 64 and projectors[1].out_features == 32
    with pytest.raises(
        Refused,
        match="the student's model.layers.0.mlp.up_proj \\(64 wide\\) "
        "and the teacher's model.layers.1 \\(32 wide\\) differ in width",
    ):
        make_projectors(pairs, models.student, teacher, "none")
    with pytest.raises(ValueError, match="distill.projector='mlp2'"):
        make_projectors(pairs, models.student, teacher, "mlp2")


def test_projectors_take_the_students_dtype(pair_of_models) -> None:
    models, teacher = pair_of_models
    student = models.student.to(torch.float64)
    pairs = [LayerPair("model.layers.0.mlp.up_proj", "model.layers.1")]
    (projector,) = make_projectors(pairs, student, teacher, "linear")
    assert projector.weight.dtype == torch.float64


def test_masked_feature_sum_ignores_padding() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(2, 2, 5, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    value = masked_feature_sum(student, teacher, mask, mse)
    torch.testing.assert_close(value, ((student - teacher) ** 2).mean(-1)[mask].sum())
    moved = student.clone()
    moved[0, 3:] += 50.0
    torch.testing.assert_close(masked_feature_sum(moved, teacher, mask, mse), value)


def test_cosine_is_scale_free() -> None:
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(cosine(x, 10 * x), torch.zeros(4, dtype=torch.float64))
    assert get_feature_loss("cosine") is cosine


def test_shape_mismatch_names_projector() -> None:
    with pytest.raises(ValueError, match="a projector must map"):
        masked_feature_sum(
            torch.ones(1, 2, 3), torch.ones(1, 2, 4), torch.ones(1, 2, dtype=torch.bool), mse
        )


def test_a_head_pair_in_a_hand_written_step_says_why_it_never_runs(pair_of_models) -> None:
    """From Python there is no pre-flight: the step said a module that runs in the model's own
    forward "did not run", with no word of the chunked loss or its fix (probe 51)."""
    from lightning_kd.distill.distiller import Distiller
    from lightning_kd.distill.objective import DistillConfig

    models, teacher = pair_of_models
    head = [{"student": "lm_head", "teacher": "lm_head"}]
    ids = torch.randint(0, 257, (1, 8))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    chunked = Distiller(teacher, models.student, DistillConfig(compile=False, features=head))
    why = r"applies the output head .* distill.chunked=false"
    with pytest.raises(ModuleChoiceError, match=why):
        chunked(batch)
    config = DistillConfig(compile=False, chunked=False, features=head)
    assert torch.isfinite(Distiller(teacher, models.student, config)(batch)[1].features)
