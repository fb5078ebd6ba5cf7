"""A batch as the distiller reads it: checked, and with nothing scored at a padded position.

The data modules' batches already mask padding in their labels; a batch built by hand (a
notebook, a loop of one's own: ``tokenizer(texts, padding=True)`` and ``labels = input_ids``)
often does not. Unmasked, each pad became a target (a student taught to write ``<|im_end|>``
after its text) and, with left padding, a pad's output predicted the first real token.

A hand-built batch is refused, naming the key, before a model sees it: a key left ``None`` (as
some collators leave one), no row or no position, ids that are not integers, and ids or labels
outside the vocabulary (an embedding's bare ``IndexError`` on a CPU, a device-side assert that
ends the process on a GPU). The range check reads a few numbers back from the device per batch.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_kd.losses.logits import IGNORE_INDEX

NEEDED = {"causal_lm": ("input_ids", "attention_mask", "labels"), "encoder": ("input_ids",)}
"""The keys each task reads (an encoder's mask and labels are optional)."""

SAME_SHAPE = ("attention_mask", "labels", "position_ids", "token_type_ids")
"""The keys beside ``input_ids`` that hold a value per position, when given."""
INDICES = ("input_ids", "labels", "position_ids")
"""The keys that index a table (an embedding's, the vocabulary's)."""

FORM = (
    "a distillation batch holds input_ids, attention_mask and labels [batch, seq] (labels -100 "
    "where nothing is scored), as lightning_kd.data's data modules write them"
)


def checked_batch(
    batch: dict[str, Tensor], task: str, model: nn.Module | None = None, rows: int | None = None
) -> dict[str, Tensor]:
    """``batch`` (of a ``task``'s), a causal LM's with its labels masked (−100) wherever the
    attention mask leaves a position out or the position before it: no pad is a target, and no
    pad's output is scored. Raises a ``ValueError`` naming what is missing or misshapen, and
    (given the ``model`` that reads it) ids or labels outside its vocabulary, or past ``rows``
    (a teacher that reads the same ids with fewer embedding rows: probe 51)."""
    if not isinstance(batch, Mapping):  # a collator's tuple, a list of rows
        raise ValueError(f"the batch is a {type(batch).__name__}: {FORM}, in a dict")
    missing = [key for key in NEEDED[task] if batch.get(key) is None]
    if missing:
        raise ValueError(f"the batch lacks {missing} (it has {given_keys(batch)}): {FORM}")
    ids = batch["input_ids"]
    for key in ("input_ids", *SAME_SHAPE):
        value = batch.get(key)  # a tokenizer called without return_tensors gives lists
        if value is not None and (not isinstance(value, Tensor) or value.dim() != 2):
            got = f"of shape {tuple(value.shape)}" if isinstance(value, Tensor) else None
            raise ValueError(
                f"{key} is {got or type(value).__name__}; a batch holds tensors [batch, seq] "
                "(one sequence: input_ids.unsqueeze(0), and the same for the other keys; from a "
                "tokenizer: return_tensors='pt')"
            )
    for key in SAME_SHAPE:
        if batch.get(key) is not None and batch[key].shape != ids.shape:
            raise ValueError(
                f"{key} has shape {tuple(batch[key].shape)}, input_ids {tuple(ids.shape)}: "
                "each position needs its own (labels are not shifted: the loss shifts them)"
            )
    if not ids.numel():
        raise ValueError(f"input_ids has shape {tuple(ids.shape)}: no row or no position to score")
    for key in (*INDICES, "token_type_ids"):  # indices: a float one reached gather
        value = batch.get(key)
        if value is not None and (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool
        ):
            raise ValueError(f"{key} are {value.dtype}; {key} are integers (torch.long)")
    # Other integers (int16, uint8, int32) as the embedding and gather take them: int64.
    indices = (*INDICES, "token_type_ids")
    batch = {**batch, **{k: batch[k].long() for k in indices if batch.get(k) is not None}}
    if model is not None:
        vocab = model.get_input_embeddings().num_embeddings
        check_range(batch, task, vocab if rows is None else min(vocab, rows))
    if task != "causal_lm":  # an encoder scores every attended position itself
        if batch.get("attention_mask") is None:  # optional: every position attended (probe 51)
            batch = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
        return batch
    return {**batch, "labels": unpadded_labels(batch["labels"], batch["attention_mask"])}


def given_keys(batch: dict) -> list[str]:
    """The keys that hold something (a ``None`` is no value)."""
    return sorted(key for key, value in batch.items() if value is not None)


def check_range(batch: dict[str, Tensor], task: str, vocab: int) -> None:
    """Refuse ids outside ``[0, vocab)``, (a causal LM's) labels outside it but −100, and an
    attention mask of other values than 0 and 1: positions are counted from the mask, so a mask
    of 2s or of segment ids (as some packing collators write) read the tokens at other
    positions, and kept the documents of a row attending to each other, without an error."""
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    bounds = [ids.min(), ids.max()]
    bounds.append(((mask != 0) & (mask != 1)).sum() if mask is not None else ids.new_zeros(()))
    labels = batch.get("labels") if task == "causal_lm" else None
    if labels is not None:
        wrong = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab))
        bounds.append(wrong.sum())
    low, high, bad_mask, *bad_labels = torch.stack(bounds).tolist()  # one read from the device
    if bad_mask:
        raise ValueError(
            f"attention_mask holds {bad_mask} value(s) other than 0 and 1: it says which "
            "positions are tokens (1) and which are padding (0); for several documents in a row, "
            "give each its positions in position_ids (restarting at 0), not segment ids in the mask"
        )
    if low < 0 or high >= vocab:
        raise ValueError(
            f"input_ids hold {low if low < 0 else high}, outside the model's vocabulary "
            f"[0, {vocab}): tokenize with the model's own tokenizer"
        )
    if bad_labels and bad_labels[0]:
        raise ValueError(
            f"labels hold {bad_labels[0]} value(s) outside the vocabulary [0, {vocab}) other "
            f"than {IGNORE_INDEX} (not scored): labels are the next tokens' ids, unshifted"
        )


def unpadded_labels(labels: Tensor, attention_mask: Tensor) -> Tensor:
    """``labels`` at −100 on every padded position and every position right after one (whose
    predictor is a pad: the first real token of a left-padded row). No host sync."""
    padded = attention_mask == 0
    after_pad = F.pad(padded[:, :-1], (1, 0), value=False)
    return labels.masked_fill(padded | after_pad, IGNORE_INDEX)
