"""Saved models named on the command line: a ``save_pretrained`` directory, a Hugging Face id, a
packaged teacher (``smollm2``, ``gemma3_270m``) or a ``.gguf`` file (read by transformers' GGUF
loader and converted once, as a GGUF teacher is), loaded in fp32 for evaluation."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_kd.models.finite_weights import nonfinite_error
from lightning_kd.models.names import shadowing_error
from lightning_kd.models.packaged import PACKAGED, missing_error
from lightning_kd.models.sources import (
    checked_model_path,
    convert_gguf,
    is_gguf,
    teacher_dir,
)
from lightning_kd.models.unreadable import loaded_whole, readable
from lightning_kd.utils.refusal import Refused


def model_location(name: str, key: str = "model") -> str:
    """``from_pretrained``'s argument for ``name`` (packaged models converted once); a missing
    one refused naming ``key``, how the command was given it (``--teacher``, a model)."""
    if error := shadowing_error(name, key):
        raise Refused(error)
    if name in PACKAGED:
        if error := missing_error(name, key):
            raise FileNotFoundError(error)
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


def load_tokenizer(name: str, trust: bool = False):
    """``name``'s tokenizer (a damaged file named, with the fix); ``trust``: its own code run
    (``--trust-remote-code``)."""
    location = model_location(name)
    with readable(location, f"{name}'s tokenizer"):
        return AutoTokenizer.from_pretrained(location, trust_remote_code=trust)


def load_model(name: str, tokenizer=None, reference: str = "the first model", trust=False):
    """``name``'s causal LM in fp32, eval mode; refused if its tokenizer is not ``tokenizer``
    (``reference``'s, named in the refusal); ``trust``: its own code run."""
    if tokenizer is not None and load_tokenizer(name, trust).get_vocab() != tokenizer.get_vocab():
        raise Refused(f"{name} has another tokenizer than {reference}: not comparable")
    location = model_location(name)
    with readable(location, name):
        try:
            load = AutoModelForCausalLM.from_pretrained
            model = loaded_whole(load, location, name, dtype=torch.float32, trust_remote_code=trust)
        except ValueError as error:
            if "Unrecognized configuration class" not in str(error):
                raise
            raise Refused(
                f"{name} is no causal language model (transformers has no *ForCausalLM for its "
                "config, e.g. an encoder-decoder like T5): evaluate scores causal LMs"
            ) from None
    model.eval()
    if error := nonfinite_error(model, name, "Export it again, or score an earlier checkpoint"):
        raise Refused(error)  # its NaN logits read as a model that reads ahead (probe 59)
    if reads_ahead(model):
        raise Refused(
            f"{name} reads ahead: its prediction at a position changes with a later token (a "
            f"bidirectional encoder, {type(model).__name__}, loaded with a language-model head), "
            "so it has no next-token perplexity; evaluate causal language models"
        )
    return model


@torch.no_grad()
def reads_ahead(model, length: int = 8) -> bool:
    """Whether ``model``'s logits before the last position change when only the last token
    does: a causal LM's cannot (a BERT or RoBERTa loaded as ``*ForCausalLM`` without
    ``is_decoder`` sees every token, and scored 3.9 bits per byte as if it were one)."""
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.arange(1, length + 1).remainder(vocab).unsqueeze(0)
    other = ids.clone()
    other[0, -1] = (ids[0, -1] + 1) % vocab
    device = next(model.parameters()).device
    first, second = (model(input_ids=row.to(device)).logits[0, :-1] for row in (ids, other))
    return not torch.allclose(first, second, rtol=1e-4, atol=1e-5)
