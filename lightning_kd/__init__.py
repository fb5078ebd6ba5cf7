"""lightning-kd: distil a Hugging Face teacher into a smaller student with PyTorch Lightning.

The public API: the names below, from the package root, and the losses as pure tensor functions
in ``lightning_kd.losses``. They load on first use, so ``import lightning_kd.losses`` does not
pull in Lightning or transformers. The layers under them: ``docs/architecture.md``.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import version

# transformers imports torchao whenever it is installed (teacher.quantize uses it), and torchao's
# wheel then logs a warning for each CUDA kernel a CPU-only torch cannot load: nothing to act on.
# Quietened unless the user set that logger's level themselves.
# torch itself then warns that torchao registers its enums as pytree constants (a deprecation
# between those two libraries, twice per process).
for _name in ("torchao", "torch.utils._pytree"):
    _logger = logging.getLogger(_name)
    if _logger.level == logging.NOTSET:
        _logger.setLevel(logging.ERROR)

# DeepSpeed, when installed, is imported by transformers' save (through accelerate) and warns
# that it found no GPU on a machine that has none: dropped, its other messages kept.
logging.getLogger("DeepSpeed").addFilter(
    lambda record: not str(record.msg).startswith("Setting accelerator to CPU")
)

__version__ = version("lightning-kd")

_EXPORTS = {
    # the step as a plain nn.Module, and what it is built from
    "Distiller": "lightning_kd.distill.distiller",
    "DistillConfig": "lightning_kd.distill.objective",
    "TeacherSpec": "lightning_kd.models.loading",
    "StudentSpec": "lightning_kd.models.loading",
    # Lightning
    "DistillationModule": "lightning_kd.training.module",
    "TextDataModule": "lightning_kd.data.text",
    "ChatDataModule": "lightning_kd.data.chat",
    # the configuration users run, and a whole run from it
    "compose_config": "lightning_kd.launch.config",
    "train": "lightning_kd.launch.run_from_python",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lightning_kd' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The lazy names too, for ``dir()`` and completion."""
    return sorted({*globals(), *_EXPORTS})
