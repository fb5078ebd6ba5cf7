"""A batch as the distiller reads it: checked, and with nothing scored at a padded position.

The data modules' batches already mask padding in their labels; a batch built by hand (a
notebook, a loop of one's own: ``tokenizer(texts, padding=True)`` and ``labels = input_ids``)
often does not. Unmasked, each pad became a target (a student taught to write ``<|im_end|>``
after its text) and, with left padding, a pad's output predicted the first real token.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lightning_kd.losses.logits import IGNORE_INDEX

NEEDED = {"causal_lm": ("input_ids", "attention_mask", "labels"), "encoder": ("input_ids",)}
"""The keys each task reads (an encoder's mask and labels are optional)."""


def checked_batch(batch: dict[str, Tensor], task: str) -> dict[str, Tensor]:
    """``batch`` (of a ``task``'s), a causal LM's with its labels masked (−100) wherever the
    attention mask leaves a position out or the position before it: no pad is a target, and no
    pad's output is scored. Raises a ``ValueError`` naming what is missing or misshapen."""
    missing = [key for key in NEEDED[task] if key not in batch]
    if missing:
        raise ValueError(
            f"the batch lacks {missing} (it has {sorted(batch)}): a distillation batch holds "
            "input_ids, attention_mask and labels [batch, seq] (labels -100 where nothing is "
            "scored), as lightning_kd.data's data modules write them"
        )
    ids = batch["input_ids"]
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        got = f"of shape {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(
            f"input_ids is {got}; a batch holds tensors [batch, seq] (one sequence: "
            "input_ids.unsqueeze(0), and the same for the other keys; from a tokenizer: "
            "return_tensors='pt')"
        )
    for key in ("attention_mask", "labels"):
        if key in batch and batch[key].shape != ids.shape:
            raise ValueError(
                f"{key} has shape {tuple(batch[key].shape)}, input_ids {tuple(ids.shape)}: "
                "each position needs its own (labels are not shifted: the loss shifts them)"
            )
    if task != "causal_lm":  # an encoder scores every attended position itself
        return batch
    return {**batch, "labels": unpadded_labels(batch["labels"], batch["attention_mask"])}


def unpadded_labels(labels: Tensor, attention_mask: Tensor) -> Tensor:
    """``labels`` at −100 on every padded position and every position right after one (whose
    predictor is a pad: the first real token of a left-padded row). No host sync."""
    padded = attention_mask == 0
    after_pad = F.pad(padded[:, :-1], (1, 0), value=False)
    return labels.masked_fill(padded | after_pad, IGNORE_INDEX)
