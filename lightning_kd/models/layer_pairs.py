"""Which activations are matched: layer pairs from config, and the projectors between widths.

``distill.features`` is either a list of pairs ``{student, teacher, loss, weight}`` (module paths on
the unwrapped Hugging Face models, as ``named_modules()`` prints them) or the shorthand
``uniform``: student decoder layer j ↔ the teacher layer it was copied from (or, for a student not
copied from the teacher, the evenly spaced teacher layer it would have been), or ``spans``: student
layer j ↔ the last teacher layer of the span it stands for — the one just before the teacher layer
that student layer j + 1 copies (TinyBERT's mapping). With ``spans`` each student layer is asked
for what its successor's copied weights were trained to read; the last pairs with the teacher's
last either way.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from torch import nn

from lightning_kd.losses.features import get_feature_loss
from lightning_kd.models.capture import ModuleChoiceError, resolve_module
from lightning_kd.models.layer_config import decoder_layers
from lightning_kd.models.student import evenly_spaced
from lightning_kd.utils.refusal import Refused, is_number, refuse

UNIFORM = "uniform"
SPANS = "spans"
MAPPINGS = (UNIFORM, SPANS)
PROJECTORS = ("linear", "none")


@dataclass(frozen=True)
class LayerPair:
    """One matched pair of modules and how their outputs are compared."""

    student: str
    teacher: str
    loss: str = "cosine"
    weight: float = 1.0

    def __post_init__(self) -> None:
        get_feature_loss(self.loss)  # raises on an unknown name
        weight = self.weight
        if not is_number(weight) or not weight >= 0:
            raise ValueError(
                f"feature pair {self.student}->{self.teacher}: weight must be >= 0 (got {weight!r})"
            )


def uniform_pairs(
    student: nn.Module,
    teacher: nn.Module,
    layer_map: list[int] | None,
    loss: str,
    weight: float,
    mapping: str = UNIFORM,
    setting: str = "distill.features=spans",
) -> list[LayerPair]:
    """Student layer j ↔ teacher layer ``layer_map[j]`` (or evenly spaced without a map); with
    ``mapping="spans"``, ↔ the teacher layer before ``layer_map[j + 1]`` (the last: the last),
    for ``setting`` (named where the map is out of order)."""
    student_path, student_layers = decoder_layers(student)
    teacher_path, teacher_layers = decoder_layers(teacher)
    if mapping == SPANS and layer_map is None and len(student_layers) > len(teacher_layers):
        raise Refused(  # evenly spaced, some teacher layers would stand for two student layers
            f"distill.features=spans pairs each student layer with the teacher layers it was "
            f"copied from; this student was not copied and has {len(student_layers)} layers "
            f"against the teacher's {len(teacher_layers)}: use distill.features=uniform, or "
            "list the pairs"
        )
    targets = layer_map or evenly_spaced(len(student_layers), len(teacher_layers))
    if mapping == SPANS:
        targets = span_ends(targets, len(teacher_layers), setting)
    return [
        LayerPair(f"{student_path}.{j}", f"{teacher_path}.{i}", loss, weight)
        for j, i in enumerate(targets)
    ]


SPAN_USERS = {
    "distill.features=spans": "use distill.features=uniform, or list the pairs",
    "distill.blockwise_passes": "or set distill.blockwise_passes=0 (no block-wise repair)",
}
"""The settings that read each student layer as a span of teacher layers, and their way out."""


def span_order_error(starts: list[int], setting: str) -> str | None:
    """Why ``setting`` (a key of :data:`SPAN_USERS`) cannot read student layers copied from
    teacher layers ``starts`` as spans: they are not in increasing teacher order. None: they
    are."""
    if all(start < following for start, following in pairwise(starts)):
        return None
    repeated = sorted({start for start in starts if starts.count(start) > 1})
    fix = (  # sorting a repeat keeps it (probe 45)
        f"teacher layer(s) {repeated} are copied twice, and a span between them would be "
        "empty: copy each once"
        if repeated
        else "sort it"
    )
    return (
        f"{setting} needs student layers copied in teacher order (each stands for the teacher "
        f"layers up to the next one's); student.layers={starts} is not increasing: {fix}, "
        f"{SPAN_USERS[setting]}"
    )


def span_ends(starts: list[int], teacher_layers: int, setting: str) -> list[int]:
    """For student layers copied from teacher layers ``starts``: the teacher layer whose output
    each student layer's output stands for (the one before the next copied layer; the last),
    for ``setting``, named where ``starts`` are out of order."""
    if error := span_order_error(starts, setting):
        raise Refused(error)
    ends = [following - 1 for _, following in pairwise(starts)]
    return [*ends, teacher_layers - 1]


def span_lengths(starts: list[int], teacher_layers: int) -> list[int]:
    """How many teacher layers each copied student layer stands for: from the layer it copies
    (the first from teacher layer 0: it reads the embeddings) to :func:`span_ends`'s end. One
    that stands for one alone is the teacher's own layer, which the block-wise repair leaves."""
    ends = span_ends(starts, teacher_layers, "distill.blockwise_passes")
    firsts = [0, *starts[1:]]
    return [end - first + 1 for first, end in zip(firsts, ends, strict=True)]


def layer_pairs(
    features: str | list[dict[str, Any]] | None,
    student: nn.Module,
    teacher: nn.Module,
    layer_map: list[int] | None,
    loss: str = "cosine",
    weight: float = 1.0,
) -> list[LayerPair]:
    """The configured pairs, in config order, with every module path checked to exist."""
    listed = listed_pairs(features, loss, weight)
    if listed is None:
        return []
    pairs = listed or uniform_pairs(student, teacher, layer_map, loss, weight, features)
    for pair in pairs:
        resolve_module(student, pair.student, "student")
        resolve_module(teacher, pair.teacher, "teacher")
    return pairs


PAIR_KEYS = ("student", "teacher", "loss", "weight")


def listed_pairs(features: Any, loss: str, weight: float) -> list[LayerPair] | None:
    """``distill.features`` read without the models: its listed pairs, ``[]`` for a mapping
    (``uniform``, ``spans``: the models give the pairs) and None for none; refused
    (:class:`~lightning_kd.utils.refusal.Refused`) naming what is wrong, which the launch checks
    before any model loads."""
    if not features:
        return None
    if features in MAPPINGS:  # its pairs take the defaults: checked as one of them would be
        try:
            LayerPair("student", "teacher", loss, weight)
        except ValueError as error:
            raise Refused(f"distill.feature_loss / feature_weight: {error}") from None
        return []
    if isinstance(features, str) or not isinstance(features, Sequence):
        near = difflib.get_close_matches(str(features), MAPPINGS, n=1)
        hint = f"did you mean {near[0]!r}? Else use" if near else "use"
        raise Refused(
            f"distill.features={features!r}: {hint} {UNIFORM!r}, {SPANS!r} or a list of pairs"
        )
    pairs = []
    for index, entry in enumerate(features):
        if not isinstance(entry, Mapping) or not {"student", "teacher"} <= set(entry):
            raise Refused(
                f"distill.features[{index}]={entry!r}: each pair needs keys student and teacher "
                "(optional: loss, weight), e.g. {student: model.layers.1, teacher: model.layers.3}"
            )
        for key in sorted(set(map(str, entry)) - set(PAIR_KEYS)):
            near = difflib.get_close_matches(key, PAIR_KEYS, n=1)
            hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(PAIR_KEYS)}"
            raise Refused(f"distill.features[{index}].{key}: a pair takes no key {key!r}; {hint}")
        try:
            pairs.append(LayerPair(**{"loss": loss, "weight": weight, **entry}))
        except ValueError as error:
            raise Refused(f"distill.features[{index}]: {error}") from None
    return pairs


def configured_pairs(
    distill: Any, student: nn.Module, teacher: nn.Module | None, layer_map: list[int] | None
) -> list[LayerPair]:
    """The pairs ``distill.features`` maps, each with its default loss and weight (none without a
    teacher to resolve them on)."""
    if teacher is None:
        return []
    loss, weight = distill.feature_loss, distill.feature_weight
    return layer_pairs(distill.features, student, teacher, layer_map, loss, weight)


def output_width(module: nn.Module, config) -> int:
    """The last dimension of ``module``'s output, read off its structure."""
    width = getattr(module, "out_features", None)  # nn.Linear, and LoRA layers wrapping one
    if isinstance(width, int):
        return width
    if isinstance(module, nn.Embedding):
        return module.embedding_dim
    weight = getattr(module, "weight", None)
    if isinstance(weight, nn.Parameter) and weight.ndim == 1:  # norms
        return weight.shape[0]
    return config.hidden_size  # decoder/encoder blocks and attention outputs: the residual width


def projector_errors(kind: str) -> list[str]:
    """Why ``distill.projector`` is not one of :data:`PROJECTORS` (empty when it is)."""
    if kind in PROJECTORS:
        return []
    return [f"distill.projector={kind!r}: choose one of {list(PROJECTORS)}"]


def make_projectors(
    pairs: list[LayerPair], student: nn.Module, teacher: nn.Module, kind: str
) -> nn.ModuleList:
    """One projector per pair, in config order: ``nn.Linear`` where widths differ, else Identity.

    Projectors train with the student, so they take its parameters' dtype (``student.dtype``).
    """
    refuse(projector_errors(kind))
    dtype = next(student.parameters()).dtype
    projectors = nn.ModuleList()
    for pair in pairs:
        width_in = output_width(student.get_submodule(pair.student), student.config)
        width_out = output_width(teacher.get_submodule(pair.teacher), teacher.config)
        if width_in == width_out:
            projectors.append(nn.Identity())
        elif kind == "none":
            raise ModuleChoiceError(
                f"the student's {pair.student} ({width_in} wide) and the teacher's {pair.teacher} "
                f"({width_out} wide) differ in width and distill.projector=none; set "
                "distill.projector=linear"
            )
        else:
            projectors.append(nn.Linear(width_in, width_out, bias=False, dtype=dtype))
    return projectors


REPAIR_LOSS = "cosine"
"""What each repaired layer's output is compared with its span's end by (scale-free, as the
teacher's residual stream grows through the span)."""


def repair_pairs(
    distill, student: nn.Module, teacher: nn.Module | None, layer_map: list[int] | None
) -> list[LayerPair]:
    """Student layer j ↔ the end of the teacher span it stands for (:func:`span_ends`),
    whose teacher outputs the repair reads; none without ``distill.blockwise_passes`` or for a
    student not copied from the teacher (``distill.repair.repair_plan`` refuses that)."""
    if not distill.blockwise_passes or layer_map is None or teacher is None:
        return []
    repair = "distill.blockwise_passes"
    return uniform_pairs(student, teacher, layer_map, REPAIR_LOSS, 1.0, SPANS, repair)
