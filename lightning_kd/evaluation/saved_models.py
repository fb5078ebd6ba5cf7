"""Saved models named on the command line: a ``save_pretrained`` directory, a Hugging Face id, a
packaged teacher (``smollm2``, ``gemma3_270m``) or a ``.gguf`` file (read by transformers' GGUF
loader and converted once, as a GGUF teacher is), loaded in fp32 for evaluation."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.models.files import loaded_whole, readable
from lightning_kd.models.sources import (
    PACKAGED,
    checked_model_path,
    convert_gguf,
    is_gguf,
    teacher_dir,
)


def model_location(name: str, key: str = "model") -> str:
    """``from_pretrained``'s argument for ``name`` (packaged models converted once); a missing
    one refused naming ``key``, how the command was given it (``--teacher``, a model)."""
    if name in PACKAGED:
        return teacher_dir(name)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):  # a GGUF export (export.gguf), compared with its source
        if not path.is_file():
            raise FileNotFoundError(f"{key}={name}: no such GGUF file")
        return str(convert_gguf(path))
    if path.is_file() and is_gguf(path):  # transformers' GGUF reader knows it by its suffix
        raise FileNotFoundError(
            f"{key}={name} is a GGUF file without the .gguf suffix, which transformers' GGUF "
            f"reader needs; rename it (mv {name} {path.with_suffix('.gguf')})"
        )
    return checked_model_path(name, key)


def load_tokenizer(name: str):
    """``name``'s tokenizer (a damaged file named, with the fix)."""
    location = model_location(name)
    with readable(location, f"{name}'s tokenizer"):
        return AutoTokenizer.from_pretrained(location)


def load_model(name: str, tokenizer=None, reference: str = "the first model"):
    """``name``'s causal LM in fp32, eval mode; refused if its tokenizer is not ``tokenizer``
    (``reference``'s, named in the refusal)."""
    if tokenizer is not None and load_tokenizer(name).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{name} has another tokenizer than {reference}: not comparable")
    location = model_location(name)
    with readable(location, name):
        load = AutoModelForCausalLM.from_pretrained
        model = loaded_whole(load, location, name, dtype=torch.float32)
    return model.eval()
