"""Whether each copied layer computes in the student what it computed in the teacher.

``layer_config.py`` moves what a family hangs on a layer's index (per-layer lists, MoE layouts)
and refuses what it knows cannot move. A family that reads its index some other way — a constant
set from ``layer_idx`` in the layer's own ``__init__``, held by no weight or config entry
(DiffLlama's λ was one) — gives a student with the teacher's weights that computes something
else, silently. This check runs both models once on a few tokens: each student layer is handed
the input its source layer got in the teacher, and the two updates (output less input) must
agree. A layer whose update differs is refused by name.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_kd.models.batch_positions import max_positions
from lightning_kd.models.layer_config import UnfittingLayers, decoder_layers

TOKENS = 128
"""The probe's least length: a layer that computes otherwise shows in a few tokens, unless it
differs in its attention window; 16 tokens missed a custom layer whose window of 20 came from
its index (probe 45). Past a window of the config's, the probe runs longer (:func:`length`)."""
WINDOWS = ("sliding_window", "attention_window", "window_size", "local_window_size")
"""Config entries of an attention window's length (one for all layers, or a layer's own)."""
LONGEST = 1024
"""The longest probe: the teacher runs whole on it, once, when the student is built."""


def length(config) -> int:
    """The probe's length for ``config``'s model: past its longest attention window (a layer's
    own too), so that two layers of other windows differ in it; within its positions."""
    configs = [config, *(getattr(config, "per_layer_config", None) or [])]
    windows = [
        w for c in configs for name in WINDOWS if isinstance(w := getattr(c, name, None), int)
    ]
    tokens = min(max([TOKENS, *(w + 2 for w in windows)]), LONGEST)
    limit = max_positions(config)
    return min(tokens, limit) if limit else tokens


TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-9}
"""Relative difference of the two updates allowed where the coarser model is of that dtype (an
fp64 teacher's copy is fp32); 5e-2 for a half-precision teacher, whose update the fp32 copy
computes with less rounding. On top, twice the dtype's rounding of the layer's input: a bf16
layer adds a small update to a large residual (BLOOM's: 0.9 to 31.6), rounded to 0.07. A layer
that computes otherwise differs by 20-40 % of its update (DiffLlama's)."""


def check_copied_layers(source: nn.Module, student: nn.Module, indices: list[int]) -> None:
    """Refuse ``student`` (``source``'s layers ``indices``, copied) when a copied layer's update
    differs from its source layer's on the same input (see the module doc)."""
    _, source_blocks = decoder_layers(source)
    _, student_blocks = decoder_layers(student)
    count = length(source.config)
    ids = torch.arange(count, device=source.device).remainder(source.config.vocab_size)[None]
    seen = run_recording(source, [source_blocks[i] for i in sorted(set(indices))], ids)
    inputs = [seen[id(source_blocks[i])][0] for i in indices]
    got = run_recording(student, list(student_blocks), ids, inputs)
    dtypes = (next(source.parameters()).dtype, next(student.parameters()).dtype)
    dtype = max(dtypes, key=lambda kind: torch.finfo(kind).eps)  # the coarser of the two
    relative, rounding = TOLERANCE.get(dtype, 5e-2), 2 * torch.finfo(dtype).eps
    for j, i in enumerate(indices):
        entered, left = seen[id(source_blocks[i])]
        expected, update = left - entered, got[id(student_blocks[j])][1] - inputs[j]
        allowed = relative * expected.norm() + rounding * entered.norm()
        if (update - expected).norm() > allowed:
            difference = float((update - expected).norm() / expected.norm().clamp_min(1e-12))
            raise UnfittingLayers(
                f"teacher layer {i}, copied as student layer {j}, computes something else there "
                f"(its update differs by {difference:.1%} on the same input): this family's "
                f"layers depend on their index beyond their weights and config "
                f"({type(source).__name__}). Keep the first layers (student.layers=[0, 1, ...]), "
                "or build the student from student.config or student.path"
            )


def run_recording(
    model: nn.Module, blocks: list[nn.Module], ids: Tensor, inputs: list[Tensor] | None = None
) -> dict[int, tuple[Tensor, Tensor]]:
    """Run ``model`` on ``ids`` in eval mode, without gradients, and return each of ``blocks``'
    (hidden-state input, output) in fp32, by ``id``; with ``inputs``, block k is handed
    ``inputs[k]`` in place of what the layers before it gave."""
    entered: dict[int, Tensor] = {}
    left: dict[int, Tensor] = {}

    def enter(k: int):
        def hook(block: nn.Module, args: tuple, kwargs: dict):
            hidden = args[0] if args else kwargs["hidden_states"]
            if inputs is not None:
                hidden = inputs[k].to(hidden.dtype)
                args, kwargs = replaced(args, kwargs, hidden)
            entered[id(block)] = hidden.float()
            return args, kwargs

        return hook

    def leave(block: nn.Module, args: tuple, kwargs: dict, output) -> None:
        left[id(block)] = (output[0] if isinstance(output, tuple | list) else output).float()

    hooks = [b.register_forward_pre_hook(enter(k), with_kwargs=True) for k, b in enumerate(blocks)]
    hooks += [b.register_forward_hook(leave, with_kwargs=True) for b in blocks]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return {key: (entered[key], left[key]) for key in entered}


def replaced(args: tuple, kwargs: dict, hidden: Tensor) -> tuple[tuple, dict]:
    """A layer's call with ``hidden`` as its hidden-state input (its first argument)."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}
