"""The model settings of ``train``, checked before any model loads.

Each spec's own checks (``teacher``, ``student``, ``distill``, as Hydra builds them),
``distill.features`` read, ``student.config``'s keys against the teacher's config, and a copied
student's layers against its source's depth: the configs read alone, no weights. Found by the
run, each was a traceback (exit 1) once the teacher had loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from transformers import PretrainedConfig

from lightning_kd.distill.repair_checks import nothing_to_repair
from lightning_kd.launch.rules import lookup
from lightning_kd.models.architecture import architecture_errors, checkpointing_errors
from lightning_kd.models.freezing import freeze_errors
from lightning_kd.models.layer_config import check_index_scaling
from lightning_kd.models.layer_pairs import (
    SPANS,
    listed_pairs,
    projector_errors,
    span_lengths,
    span_order_error,
)
from lightning_kd.models.loading import StudentSpec, TeacherSpec
from lightning_kd.models.model_config import config_from
from lightning_kd.models.positions import spec_config
from lightning_kd.models.student import check_num_layers, student_layer_indices

GROUPS = ("teacher", "student", "distill")


def model_setting_errors(cfg: Mapping, read_models: bool = True) -> list[str]:
    """One message per model setting of ``cfg`` the run would refuse once its models load;
    without ``read_models``, only those its values say alone (no model's config is read)."""
    specs, errors = built_specs(cfg)
    if errors:
        return errors
    teacher, student, distill = specs
    try:
        pairs = listed_pairs(distill.features, distill.feature_loss, distill.feature_weight)
        errors += head_pair_errors(pairs or [], distill.chunked)
    except ValueError as error:
        errors.append(str(error))
    if distill.features:
        errors += projector_errors(distill.projector)
    if not read_models:
        return errors
    try:
        base = spec_config(teacher)
    except (ValueError, OSError):  # a path refused by model_path_errors, with the rest
        return errors
    if base is None:  # a teacher.config that does not build: why
        return errors + config_from(teacher.config or {}, None, "teacher.config")[1]
    key = "teacher.path" if teacher.config is None else "teacher.config"
    if wrong := architecture_errors(base, teacher.task, key):
        return errors + wrong
    checkpointing = checkpointing_errors if student.activation_checkpointing else lambda *_: []
    if student.config is not None:
        built, wrong = config_from(student.config, base, "student.config")
        wrong = wrong or architecture_errors(built, teacher.task, "student.config")
        return errors + (wrong or checkpointing(built, teacher.task))
    if student.path is None:
        try:
            source = base if student.source is None else spec_config(TeacherSpec(student.source))
        except (ValueError, OSError):  # refused by model_path_errors, with the rest
            return errors
        wrong = architecture_errors(source, teacher.task, "student.source")
        errors += (
            wrong
            or depth_errors(student, source)
            or span_errors(student, source, distill)
            or repair_errors(student, source, distill)
        )
        errors += checkpointing(source, teacher.task)
    return errors


HEADS = ("lm_head", "embed_out")
"""The output head's module name in Hugging Face's causal LMs (GPT-NeoX: ``embed_out``)."""


def head_pair_errors(pairs: list, chunked: bool) -> list[str]:
    """A feature pair on the output head, which the chunked step never runs (it applies the
    head's weight itself): refused by the first batch's check, once both models had loaded."""
    if not chunked:
        return []
    return [
        f"distill.features: the {role} module {name!r} is the output head, which never runs in "
        "the training step (the chunked loss applies its weight itself); match a module inside "
        "the body (a decoder layer, the final norm), or set distill.chunked=false"
        for pair in pairs
        for role, name in (("student", pair.student), ("teacher", pair.teacher))
        if name in HEADS
    ]


def built_specs(cfg: Mapping) -> tuple[list, list[str]]:
    """The ``teacher``, ``student`` and ``distill`` specs as the run builds them, and why any
    does not build (its own check's message)."""
    specs, errors = [], []
    for group in GROUPS:
        node = lookup(cfg, group)
        try:
            specs.append(instantiate(node, _convert_="all"))
        except InstantiationException as error:
            cause = error.__cause__
            # The spec's own message (a missing package: the same as package_checks' message).
            errors.append(str(cause) if isinstance(cause, ValueError | ImportError) else str(error))
    return specs, errors


def span_errors(student: StudentSpec, source: PretrainedConfig, distill) -> list[str]:
    """Student layers copied out of teacher order (``student.layers=[3,1]``) where a setting
    reads each as a span of teacher layers: ``distill.features=spans``, the block-wise repair.
    Found once the models had loaded, where the repair was told to change the features."""
    if student.by_importance or student.source is not None:
        return []  # chosen later, in order; or copied from another model than the teacher
    indices = student_layer_indices(student, source.num_hidden_layers)
    users = ["distill.features=spans"] if distill.features == SPANS else []
    users += ["distill.blockwise_passes"] if distill.blockwise_passes else []
    return [error for user in users if (error := span_order_error(indices, user))]


def depth_errors(student: StudentSpec, source: PretrainedConfig) -> list[str]:
    """A copied student's layers (``student.layers``, ``num_layers``, ``freeze_layers``) against
    the layers of the model it copies (``source``: its config)."""
    depth = source.num_hidden_layers
    try:
        if student.by_importance:  # the layers are chosen later, of the teacher's
            check_num_layers(student.num_layers, depth)
            return []
        indices = student_layer_indices(student, depth)
        check_index_scaling(source, indices)
    except ValueError as error:
        return [str(error)]
    return freeze_errors(student.freeze_layers, len(indices))


def repair_errors(student: StudentSpec, source: PretrainedConfig, distill) -> list[str]:
    """A block-wise repair with no layer to repair (each student layer standing for several
    teacher layers frozen by ``student.freeze_layers``, or none standing for several), from the
    configs alone: refused at the repair, ``auto`` had counted its passes and written a cache
    for them (verify 57)."""
    if not distill.blockwise_passes or student.by_importance:
        return []  # importance: the layers are chosen later
    depth = source.num_hidden_layers  # its layers checked by depth_errors and span_errors first
    lengths = span_lengths(student_layer_indices(student, depth), depth)
    frozen = [f"student layer {j}" for j, n in enumerate(lengths[: student.freeze_layers]) if n > 1]
    if any(n > 1 for n in lengths[student.freeze_layers :]):
        return []
    return [nothing_to_repair(frozen)]
