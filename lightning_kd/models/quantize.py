"""A teacher in fewer bits: ``teacher.quantize=int8``.

Weight-only int8 with torchao (``Int8WeightOnlyConfig``): every ``nn.Linear`` weight of the
teacher's blocks is held as int8 with one scale per output row and dequantized inside its matmul;
activations stay in the teacher's dtype (or autocast's). The modules stay ``nn.Linear`` — only
their weight becomes a tensor subclass — so hooks, captures and module paths are unchanged.

The output head stays in the teacher's dtype: the chunked loss multiplies hidden states by its
weight itself, and in tied models (SmolLM2) it *is* the input embedding, which quantizing the head
as a Linear would untie into a second, int8 copy beside the full-precision embedding.

Chosen over optimum-quanto's qint8 (``docs/int8-teacher.md``): the same memory and perplexity,
but quanto's CPU int8 kernel refuses bf16 activations against fp32 scales, so the teacher would
fail under ``bf16-mixed``; torchao's runs under autocast.

This module imports torchao only when a teacher is quantized.
"""

from __future__ import annotations

import sys
import warnings
from importlib.util import find_spec

import torch
from torch import Tensor, nn

from lightning_kd.utils.refusal import Refused

MODES = ("int8",)
"""What ``teacher.quantize`` accepts (besides null: full precision)."""
DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Teacher dtypes torchao quantizes (it refuses float64)."""
ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
"""Where the int8 kernels run."""
STRATEGIES = ("fsdp", "deepspeed")
"""Strategies that flatten or partition the teacher's parameters as plain tensors, which torchao's
int8 weights are not (refused rather than tried: they run on GPUs only)."""
INSTALL = "pip install 'lightning-kd[quantize]'"
"""The extra that brings torchao (of the release this module needs): the advice works for a
wheel as for a checkout."""


def check_quantize(mode: str | None, dtype: str) -> None:
    """Refuse an unknown ``teacher.quantize``, a dtype torchao cannot quantize, or a missing
    torchao — before any model is loaded."""
    if mode is None:
        return
    if mode not in MODES:
        raise ValueError(
            f"teacher.quantize={mode!r} is not supported; choose one of {list(MODES)} "
            "(weight-only, torchao) or null for a full-precision teacher"
        )
    if dtype not in DTYPES:
        raise ValueError(
            f"teacher.quantize={mode} quantizes float32, bfloat16 or float16 weights, not "
            f"teacher.dtype={dtype}; set teacher.dtype=float32 (or auto), or teacher.quantize=null"
        )
    if message := missing_torchao(mode):
        raise ModuleNotFoundError(message)


def missing_torchao(mode: str | None) -> str | None:
    """Why ``teacher.quantize=mode`` cannot run here (torchao not installed, with the fix), or
    None; found without importing torchao, so the launch checks refuse it before anything
    loads. An unknown mode is ``check_quantize``'s to name."""
    if mode in MODES and find_spec("torchao") is None:
        return (
            f"teacher.quantize={mode} needs the torchao package, which is not installed: "
            f"{INSTALL} (or set teacher.quantize=null)"
        )
    return None


def backend_errors(mode: str | None, accelerator: str | None, strategy: str | None) -> list[str]:
    """Why ``teacher.quantize=mode`` cannot run on ``trainer.accelerator`` / ``strategy``
    (empty when it can): the int8 kernels exist for CPUs and CUDA GPUs, and a sharding strategy
    cannot flatten int8 weights."""
    if mode is None:
        return []
    errors = []
    if str(accelerator or "auto").lower() not in ACCELERATORS:
        errors.append(
            f"teacher.quantize={mode} runs on cpu or cuda, not trainer.accelerator={accelerator}; "
            "set teacher.quantize=null there"
        )
    name = str(strategy or "").lower()
    sharding = next((kind for kind in STRATEGIES if kind in name), None)
    if sharding is not None:
        errors.append(
            f"teacher.quantize={mode} with strategy={sharding}: {sharding} shards the teacher's "
            "weights as plain tensors, not int8 ones; use strategy=ddp (each rank holds the small "
            "int8 teacher), or teacher.quantize=null"
        )
    return errors


def quantize_teacher(model: nn.Module, mode: str) -> nn.Module:
    """Quantize ``model``'s Linear weights in place (not its output head; see the module doc)
    and return it, frozen and in eval mode. A Linear whose class computes its own matmul
    (Falcon's ``input @ self.weight.T``, which torchao's int8 tensor does not run) stays in full
    precision; a teacher with no Linear weight left to quantize (GPT-2's ``Conv1D`` blocks) is
    refused, rather than run in full precision as if it were int8."""
    check_quantize(mode, "auto")
    config_class, quantize_ = _torchao()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None

    def in_blocks(module: nn.Module, name: str) -> bool:
        plain = not own_matmul(module)  # F.linear: what torchao's int8 tensor dispatches
        return isinstance(module, nn.Linear) and plain and module is not head

    quantize_(model, config_class(), filter_fn=in_blocks)
    if not any(is_quantized(parameter) for parameter in model.parameters()):
        raise Refused(nothing_quantized(model, mode, head))
    warn_full_precision(model, mode, head)
    release_file_mapping(model)
    return model.requires_grad_(False).eval()


FULL_SHARE = 0.2
"""The share of a teacher's block weights left in full precision from which it is said."""


def warn_full_precision(model: nn.Module, mode: str, head: nn.Module | None) -> None:
    """Warn where more than :data:`FULL_SHARE` of ``model``'s weight matrices outside its
    embeddings and head stay in full precision: a mixture of experts holds its experts as 3-D
    tensors, not ``nn.Linear`` (Mixtral's in transformers 5: 89 % of the block weights left in
    fp32 under "int8 weights", probe 45)."""
    skipped = {
        id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()
    }
    skipped |= {id(p) for p in (head.parameters() if head is not None else ())}
    weights = [
        (name, p) for name, p in model.named_parameters() if p.dim() >= 2 and id(p) not in skipped
    ]
    full = [(name, p) for name, p in weights if not is_quantized(p)]
    share = sum(p.numel() for _, p in full) / max(1, sum(p.numel() for _, p in weights))
    if share > FULL_SHARE:
        names = ", ".join(name for name, _ in full[:3])
        warnings.warn(
            f"teacher.quantize={mode}: {share:.0%} of {type(model).__name__}'s block weights "
            f"stay in full precision (e.g. {names}: weights torchao's int8 quantizes only as "
            "nn.Linear, as a mixture of experts' are not), so int8 saves little of the "
            "teacher's memory",
            stacklevel=3,
        )


def nothing_quantized(model: nn.Module, mode: str, head: nn.Module | None) -> str:
    """The refusal of a teacher none of whose block weights ``mode`` can quantize, naming the
    layer classes it holds instead of plain ``nn.Linear``."""
    kinds = sorted(
        {
            type(module).__name__
            for module in model.modules()
            if module is not head and (type(module).__name__ == "Conv1D" or own_matmul(module))
        }
    )
    held = f" (its layers are {', '.join(kinds)})" if kinds else ""
    return (
        f"teacher.quantize={mode}: {type(model).__name__} has no nn.Linear weight torchao can "
        f"quantize{held}, so the teacher would run in full precision; set teacher.quantize=null"
    )


def own_matmul(module: nn.Module) -> bool:
    """Whether ``module`` is an ``nn.Linear`` whose class computes its own product."""
    return isinstance(module, nn.Linear) and type(module).forward is not nn.Linear.forward


def release_file_mapping(model: nn.Module) -> None:
    """Copy ``model``'s full-precision tensors into memory of their own.

    ``from_pretrained`` memory-maps the safetensors file and the weights stay views of that one
    mapping: while any of them (the embedding) lives, the whole file — the fp32 Linear weights
    quantization replaced included — stays mapped and resident. Copied out, the mapping goes.
    """
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if not is_quantized(tensor):
                tensor.data = tensor.data.clone()  # the same Parameter: ties stay tied


def _torchao():
    """torchao's int8 weight-only config class and ``quantize_`` (imported only when used)."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError as err:
        raise ImportError(
            f"teacher.quantize=int8 needs torchao's Int8WeightOnlyConfig ({err}); "
            "upgrade: pip install --upgrade 'lightning-kd[quantize]'"
        ) from err
    return Int8WeightOnlyConfig, quantize_


def is_quantized(tensor: Tensor) -> bool:
    """Whether ``tensor`` is one of torchao's quantized tensors (int8 data and scales inside).
    Without torchao imported, no tensor can be."""
    torchao_utils = sys.modules.get("torchao.utils")
    return torchao_utils is not None and isinstance(tensor, torchao_utils.TorchAOBaseTensor)


def plain(tensor: Tensor) -> Tensor:
    """``tensor`` as the plain tensor it stands for: quantized ones dequantized."""
    return tensor.dequantize() if is_quantized(tensor) else tensor


def tensor_bytes(tensor: Tensor) -> int:
    """The bytes ``tensor`` holds: a quantized one's int8 data and scales, not its logical
    size."""
    if is_quantized(tensor):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()
