"""The config of a model that keeps some of its layers: what a layer is may hang on its index.

A copied layer must compute in the student what it computed in the teacher. Most architectures
decide everything per layer from the layer's weights, but some read it off the layer's index in
the config, which the copy changes (teacher layer 3 becomes student layer 1):

- per-layer lists (``layer_types``: sliding or full attention in Gemma, Qwen, Mistral;
  ``no_rope_layers``: SmolLM3's layers without rotary positions; GPT-Neo's global or local
  ``attention_layers``, with the ``attention_types`` it is expanded from) — taken at the kept
  indices; one the config class derives itself (Mamba's, Jamba's read-only ``layer_types``) is
  left to it, and a kept layer of another kind then fails to fit (below);
- Qwen2-MoE / Qwen3-MoE choose sparse or dense MLPs by index (``decoder_sparse_step``,
  ``mlp_only_layers``) — rewritten as the dense layers' new indices, one step; DeepSeek-V2/V3,
  GLM-4-MoE and dots1 make their first ``first_k_dense_replace`` layers dense — rewritten as the
  count of kept dense layers where they come first;
- GPT-2's ``scale_attn_by_inverse_layer_idx`` scales attention by 1 / (index + 1), DiffLlama
  initialises its λ from the index, with nothing in the config to undo it — refused unless every
  kept layer keeps its index.

A kind of layer that still differs shows as the copied weights not fitting the student built from
the config (a MoE scheme of another family): refused naming the layers, not a ``load_state_dict``
traceback.
"""

from __future__ import annotations

import copy
import re

from torch import nn
from transformers import PretrainedConfig

from lightning_kd.utils.refusal import Refused

PER_LAYER = (
    "layer_types",
    "no_rope_layers",
    "mlp_layer_types",
    "swiglu_limits",
    "kv_sharing_modes",
    "indexer_types",
)
"""Config lists with one entry per layer, in layer order (``mlp_layer_types``: dense or
experts, read by 29 families in transformers 5; left whole, EXAONE-MoE's student trained and
then failed to save, probe 45)."""


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The module path and the ``ModuleList`` of a transformer's repeated blocks.

    Found as the ``ModuleList`` of ``config.num_hidden_layers`` modules that holds the most
    parameters (``model.layers`` in Llama/Qwen, ``encoder.layer`` in BERT, ``transformer.h`` in
    GPT-2): the first such list was a custom model's per-layer gates, declared before its
    blocks, and the blocks were refused as "weights outside its decoder layers" (probe 45).
    """
    count = model.config.num_hidden_layers
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) == count
    ]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of {count} decoder layers")
    return max(lists, key=lambda found: sum(p.numel() for p in found[1].parameters()))


def pruned_config(config: PretrainedConfig, indices: list[int]) -> PretrainedConfig:
    """``config`` for a model of the layers ``indices`` of the one it describes, each computing
    what it computed there."""
    check_index_scaling(config, indices)
    config = copy.deepcopy(config)
    for name in PER_LAYER:
        values = getattr(config, name, None)
        held = type(config).attribute_map.get(name, name)  # FalconH1's: layers_block_type
        derived = isinstance(getattr(type(config), held, None), property)  # Mamba's: read-only
        per_layer = isinstance(values, list | tuple) and len(values) == config.num_hidden_layers
        if per_layer and not derived:
            setattr(config, name, [values[i] for i in indices])
    if isinstance(kinds := getattr(config, "attention_layers", None), list):  # GPT-Neo's
        config.attention_types = [[[kinds[i]], 1] for i in indices]  # what a saved one reads
        config.attention_layers = [kinds[i] for i in indices]
    if isinstance(dense_first := getattr(config, "first_k_dense_replace", None), int):
        dense = [i < dense_first for i in indices]  # DeepSeek-V2/V3, GLM-4-MoE, dots1
        if dense == sorted(dense, reverse=True):  # dense ones first: one count says it
            config.first_k_dense_replace = sum(dense)
    if hasattr(config, "decoder_sparse_step") and hasattr(config, "mlp_only_layers"):
        dense = [not sparse_mlp(config, i) for i in indices]
        config.mlp_only_layers = [j for j, is_dense in enumerate(dense) if is_dense]
        config.decoder_sparse_step = 1
    overrides = per_layer_overrides(config)
    config.num_hidden_layers = len(indices)
    if overrides is not None:  # transformers' heterogeneous configs (NeoMME's windows)
        moved = {j: overrides[str(i)] for j, i in enumerate(indices) if str(i) in overrides}
        config.per_layer_config = moved
    return config


def per_layer_overrides(config: PretrainedConfig) -> dict[str, dict] | None:
    """A heterogeneous config's per-layer overrides by layer index (``{"1": {"sliding_window":
    1024}}``), or None: left in the teacher's layer order, a student of NeoMME's layers
    [0, 2, 3] got windows [257, 1025, full] for [257, 257, full] (probe 45)."""
    if not getattr(config, "is_heterogeneous", False):
        return None
    return dict(config.to_dict().get("per_layer_config") or {})


def sparse_mlp(config: PretrainedConfig, index: int) -> bool:
    """Whether Qwen2-MoE / Qwen3-MoE give layer ``index`` its experts (their own rule)."""
    experts = getattr(config, "num_experts", 0) or 0
    step = config.decoder_sparse_step
    return index not in config.mlp_only_layers and experts > 0 and (index + 1) % step == 0


class UnfittingLayers(Refused, ValueError):
    """Copied layers the student's config builds as other kinds: refused (exit 2)."""


INDEXED = {
    "diffllama": "each layer's differential-attention λ is initialised from its index "
    "(lambda_init, held by no weight or config entry)",
}
"""Model types whose layers compute with a value of their index that nothing copies."""


def check_index_scaling(config: PretrainedConfig, indices: list[int]) -> None:
    """Refuse a layer that computes with its own index (GPT-2's attention scaled by
    1 / (index + 1), DiffLlama's λ) where a kept layer moves."""
    if getattr(config, "scale_attn_by_inverse_layer_idx", False):
        what = (
            "the teacher scales each layer's attention by 1 / (layer index + 1) "
            "(scale_attn_by_inverse_layer_idx=true)"
        )
    elif (why := INDEXED.get(getattr(config, "model_type", None))) is not None:
        what = f"in the teacher ({config.model_type}) {why}"
    else:
        return
    moved = [(i, j) for j, i in enumerate(indices) if i != j]
    if moved:
        raise UnfittingLayers(
            f"{what}, and a copied layer would take another index (teacher layer "
            f"{moved[0][0]} as student layer {moved[0][1]}), so it would compute something "
            "else: keep the first layers (student.layers=[0, 1, ...]), or build the student "
            "from student.config or student.path"
        )


def unfitting_layers_error(
    model: str, indices: list[int], error: Exception, layers: str = ""
) -> UnfittingLayers:
    """The refusal for copied layers the student's config builds otherwise (``error``: the
    strict ``load_state_dict``'s); ``layers``: the decoder layers' key prefix. A weight outside
    them that the depth shapes (Gemma 4's per-layer input embeddings) fits no choice of layers."""
    first = (str(error).splitlines()[1:2] or [str(error)])[0].strip()
    names = re.findall(r'(?:for |")([\w.]+\.(?:weight|bias))', str(error))
    if outside := [name for name in names if not name.startswith(layers)]:
        return UnfittingLayers(
            f"a {model} cannot be built with {len(indices)} of the teacher's layers: weights "
            f"outside its decoder layers are shaped by its depth ({', '.join(outside[:3])}); "
            "build the student from student.config or student.path"
        )
    return UnfittingLayers(
        f"the teacher's layers {indices} do not fit a {model} built with {len(indices)} layers: "
        f"its config makes a layer's kind depend on its index (dense or mixture-of-experts, "
        f"e.g.), and the copies land at other indices ({first[:200]}). Choose layers "
        "of the kinds the first ones have (student.layers=[...]), or build the student from "
        "student.config or student.path"
    )


def layer_indices_error(layers) -> str | None:
    """Why ``student.layers`` is no list of teacher layer indices (empty, a ``0.5``, a ``true``:
    a float reached ``range`` as a ``TypeError``), or None."""
    if layers and all(type(index) is int for index in layers):
        return None
    return f"student.layers={layers}: list teacher layer indices (integers), e.g. [0, 15, 29]"
