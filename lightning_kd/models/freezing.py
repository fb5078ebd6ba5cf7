"""What of a student does not train: its embedding side and head (``student.freeze_embeddings``),
its first layers (``student.freeze_layers``).

The embedding side is every weight the body runs before its first decoder layer, found by running
the body on two tokens: the token embeddings, and where the family has them the learned position
table (GPT-2's ``wpe``, OPT's ``embed_positions``), OPT's ``project_in`` and BLOOM's embedding
LayerNorm. Freezing the token embeddings alone left those training, so a frozen first layer's
output still needed a gradient and autograd kept the graph through the frozen layers.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from lightning_kd.models.layer_config import decoder_layers


def freeze_embedding_side(model: PreTrainedModel) -> None:
    """Stop gradients to the output head and to every weight the body runs before its first
    decoder layer (see the module doc)."""
    for module in (*embedding_side(model), model.get_output_embeddings()):
        if module is not None:
            module.requires_grad_(False)


def embedding_side(model: PreTrainedModel) -> list[nn.Module]:
    """The modules holding weights of their own that ``model``'s body runs before its first
    decoder layer (the input embeddings always among them)."""
    _, blocks = decoder_layers(model)
    ran: list[nn.Module] = []

    def record(module: nn.Module, args) -> None:
        if any(True for _ in module.parameters(recurse=False)):
            ran.append(module)

    def stop(module: nn.Module, args) -> None:
        raise FirstLayerReached  # what runs past it is not the embedding side

    owners = [m for m in model.modules() if not any(m is b for b in blocks)]
    hooks = [module.register_forward_pre_hook(record) for module in owners]
    hooks.append(blocks[0].register_forward_pre_hook(stop))
    embeddings = model.get_input_embeddings()
    ids = torch.zeros(1, 2, dtype=torch.long, device=embeddings.weight.device)
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    except FirstLayerReached:
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return [embeddings, *(module for module in ran if module is not embeddings)]


class FirstLayerReached(Exception):
    """Raised by the probe's hook on the first decoder layer: nothing past it need run."""


def freeze_errors(count: int, layers: int) -> list[str]:
    """Why ``student.freeze_layers=count`` cannot apply to a student of ``layers`` layers: it
    would freeze them all (empty when one stays trainable)."""
    if count < layers:
        return []
    return [
        f"student.freeze_layers={count} would freeze all {layers} of the student's layers; keep "
        f"at least one trainable (0..{layers - 1})"
    ]


def freeze_first_layers(model: PreTrainedModel, count: int) -> None:
    """Stop gradients to the first ``count`` decoder layers (refused unless one stays trainable)."""
    _, blocks = decoder_layers(model)
    if errors := freeze_errors(count, len(blocks)):
        raise ValueError(errors[0])
    for block in blocks[:count]:
        block.requires_grad_(False)
