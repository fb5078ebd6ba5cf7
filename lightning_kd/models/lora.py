"""LoRA students through ``peft``: ``student.lora={r: 16, alpha: 32, target_modules: [...]}``.

The student is built as usual (copied from the teacher, or ``student.path``), then ``peft``
injects low-rank adapters into the targeted linear layers and freezes everything else. Only the
adapters (and the feature projectors) train, sit in the optimizer and in the checkpoint; the frozen
base is rebuilt from the teacher or ``student.path`` on resume.

The distiller runs the unwrapped Hugging Face model (``PeftModel.get_base_model()``, the same
object with adapters inside), so module paths, hidden-state forwards and output heads are those
of a plain model. The ``PeftModel`` is kept beside it in an :class:`Adapter` — outside the module
tree, so its weights are counted, moved and saved once, as the student's — for the export: a
merged model that loads with ``from_pretrained``, and the adapter alone.

``peft`` is imported only when a LoRA student is built. This module knows transformers and peft,
not Lightning.
"""

from __future__ import annotations

import copy
import difflib
import re
import warnings
from dataclasses import dataclass, fields
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from torch import nn

from lightning_kd.utils.refusal import Refused, is_number

ADAPTER_DIR = "adapter"
"""Where the export puts a LoRA student's adapter alone, inside the student's directory."""
ALL_LINEAR = "all-linear"
"""peft's shorthand: every linear layer of the blocks, never the output head."""
INSTALL = "pip install 'lightning-kd[lora]'"
"""The extra that brings peft: the advice works for a wheel as for a checkout."""


def one_name_error(target: str) -> str:
    """Why ``target_modules=q_proj`` (one name, as one string) adapts nothing: it was refused
    once the models had loaded, told that q_proj's nearest valid name is q_proj (probe 36)."""
    return (
        f"student.lora.target_modules={target!r}: one string is a regular expression over "
        f"whole module paths (PEFT's rule), which a bare name never matches; for the modules "
        f"named {target}, give a list: student.lora.target_modules=[{target}] (or the "
        f"expression '.*{target}')"
    )


@dataclass(frozen=True)
class LoraSpec:
    """The ``student.lora`` mapping: which layers get adapters, and their size."""

    r: int = 16
    """Rank of each adapter: the update of a ``[out, in]`` weight is ``B @ A`` with A ``[r, in]``
    and B ``[out, r]`` (B starts at zero, so training starts from the student as built)."""
    alpha: float = 32.0
    """Scale of the update: ``alpha / r · B @ A``."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training."""
    target_modules: str | list[str] = ALL_LINEAR
    """Module names to adapt: a path's last parts (``q_proj``, ``self_attn.q_proj``) or a full
    path; ``all-linear`` (the default) is peft's: every linear layer but the output head (Llama:
    q/k/v/o, gate/up/down_proj; OPT-350m's project_in/out outside its blocks too, probe 45)."""

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"student.lora.r={self.r!r}: an integer >= 1, e.g. 16")
        if not is_number(self.alpha) or not self.alpha > 0:
            raise ValueError(f"student.lora.alpha={self.alpha!r}: must be a number > 0, e.g. 2 · r")
        if not is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise ValueError(f"student.lora.dropout={self.dropout!r}: must be in [0, 1)")
        if not self.target_modules or not isinstance(self.target_modules, str | list | tuple):
            raise ValueError(
                f"student.lora.target_modules={self.target_modules!r}: give module names "
                f"(e.g. [q_proj, v_proj]) or {ALL_LINEAR!r}"
            )
        if isinstance(self.target_modules, str) and re.fullmatch(r"\w+", self.target_modules):
            raise ValueError(one_name_error(self.target_modules))

    @classmethod
    def from_mapping(cls, value: dict[str, Any]) -> LoraSpec:
        """The spec of a ``student.lora`` mapping; an unknown key names the nearest valid one."""
        if not isinstance(value, dict):
            raise ValueError(
                f"student.lora={value!r}: give a mapping, e.g. 'student.lora={{r: 16, alpha: 32}}'"
            )
        known = [field.name for field in fields(cls)]
        for key in value:
            if key not in known:
                nearest = difflib.get_close_matches(str(key), known, n=1, cutoff=0.0)
                raise ValueError(
                    f"student.lora has no key {key!r} (did you mean {nearest[0]!r}?); the keys "
                    f"are {known}"
                )
        spec = dict(value)
        if isinstance(spec.get("target_modules"), tuple):
            spec["target_modules"] = list(spec["target_modules"])
        return cls(**spec)


def adaptable_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules peft can put a LoRA adapter on, by path: layers with a 2-D weight (linear
    layers, GPT-2's ``Conv1D``), without the embeddings and the output head — the chunked loss
    reads the head's weight itself and would not see an adapter there."""
    head = model.get_output_embeddings()
    found = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, nn.Embedding) or module is head:
            continue
        if isinstance(weight, nn.Parameter) and weight.ndim == 2:
            found[name] = module
    return found


def matches(target: str, path: str) -> bool:
    """peft's rule for a listed target name: the whole path, or its last dotted parts."""
    return path == target or path.endswith(f".{target}")


def check_targets(model: nn.Module, targets: str | list[str]) -> None:
    """Raise unless every target names at least one adaptable module of ``model``, listing the
    nearest valid names (the layer names the model has, e.g. ``q_proj``)."""
    if targets == ALL_LINEAR:
        return
    adaptable = adaptable_modules(model)
    names = sorted({path.rsplit(".", 1)[-1] for path in adaptable})
    every = [name for name, _ in model.named_modules() if name]
    for target in [targets] if isinstance(targets, str) else targets:
        if isinstance(targets, str):  # a single string is a regular expression over paths
            hit = [path for path in every if re.fullmatch(target, path)]
        else:
            hit = [path for path in every if matches(target, path)]
        if hit and all(path in adaptable for path in hit):
            continue
        nearest = difflib.get_close_matches(target, names, n=5, cutoff=0.0)
        raise Refused(
            f"student.lora.target_modules: {target!r} {unadaptable(model, hit, adaptable)}; "
            f"nearest valid names: {nearest} (all: {names}, or {ALL_LINEAR!r})"
        )


def unadaptable(model: nn.Module, hit: list[str], adaptable: dict[str, nn.Module]) -> str:
    """Why the modules a target matched (``hit``) take no adapter here, said of ``model``
    (``adaptable``: its :func:`adaptable_modules`, which the caller has found already)."""
    name = type(model).__name__
    if not hit:
        return f"matches no module of the student ({name})"
    kept = [path for path in hit if path not in adaptable]
    head = model.get_output_embeddings()
    if any(model.get_submodule(path) is head for path in kept):
        return (
            f"matches the student's output head ({kept[0]}), which takes no adapter: the "
            "chunked loss reads the head's weight itself and would not see one"
        )
    if any(isinstance(model.get_submodule(path), nn.Embedding) for path in kept):
        return f"matches the student's embeddings ({kept[0]}), which take no adapter here"
    kind = type(model.get_submodule(kept[0])).__name__
    return f"matches {kept[0]}, a {kind} of the student ({name}) with no 2-D weight to adapt"


def missing_peft() -> str | None:
    """Why ``student.lora`` cannot run here (peft not installed, with the fix), or None; found
    without importing peft, so the launch checks refuse it before anything loads."""
    if find_spec("peft") is None:
        return (
            "student.lora needs the peft package, which is not installed: "
            f"{INSTALL} (or set student.lora=null)"
        )
    return None


def apply_lora(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """``model`` wrapped in a ``PeftModel`` with ``spec``'s adapters; only they require grad."""
    check_targets(model, spec.target_modules)
    if message := missing_peft():
        raise ModuleNotFoundError(message)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
    )
    with warnings.catch_warnings():
        # peft reads transformers' deprecated is_gradient_checkpointing: nothing to act on here
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        return get_peft_model(model, config)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a ``PeftModel`` (without importing peft when it is not loaded)."""
    return any(cls.__module__.startswith("peft.") for cls in type(model).__mro__)


class Adapter:
    """A ``PeftModel`` kept outside the module tree: its weights are the student's own, so the
    distiller's parameters, state dict and device moves see them once, under ``student``."""

    def __init__(self, peft_model: nn.Module) -> None:
        self.peft_model = peft_model

    def merged(self) -> nn.Module:
        """A plain Hugging Face model with the adapters merged into the weights (a copy: the
        training model keeps its adapters, exactly as they are)."""
        return copy.deepcopy(self.peft_model).merge_and_unload()

    def save(self, directory: str | Path) -> None:
        """The adapter alone (``adapter_config.json``, ``adapter_model.safetensors``), loadable
        onto the student's base with ``PeftModel.from_pretrained(base, directory)``."""
        self.peft_model.save_pretrained(directory)


def save_student(student: nn.Module, adapter: Adapter | None, directory, tokenizer=None) -> None:
    """``save_pretrained`` the student into ``directory`` with ``tokenizer``; a LoRA student
    (``adapter``) with its adapters merged into the weights (a plain model for
    ``from_pretrained``), and its adapter alone in ``directory/adapter``."""
    if adapter is None:
        student.save_pretrained(directory)
    else:
        adapter.merged().save_pretrained(directory)
        adapter.save(Path(directory) / ADAPTER_DIR)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
