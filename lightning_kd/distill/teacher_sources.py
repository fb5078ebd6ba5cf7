"""Where each ``teachers`` entry's side comes from: its frozen model, or its cache opened against
it (the model then released), and its cross-tokenizer path where its tokenizer is not the
student's; a cache refusal of an entry names the entry and the command that writes *its* cache.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from lightning_kd.cache.format import INDEX_NAME
from lightning_kd.cache.reader import CacheError
from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.spelled_share import judge_first_blocks
from lightning_kd.distill.teacher_entries import TeacherEntry
from lightning_kd.distill.tokenizer_pairs import teacher_tokenizer_for
from lightning_kd.models.converted_names import packaged_name
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.models.quantize import quantize_teacher
from lightning_kd.utils.refusal import Refused


def teacher_source(
    entry: TeacherEntry,
    distill: DistillConfig,
    tokenizer: PreTrainedTokenizerBase | None,
    student: nn.Module,
    precision: str | None,
    data: Any,
) -> tuple[nn.Module | CachedTeacher, CrossTokenizer | None]:
    """``entry``'s frozen model, or its cache opened against it (the model then released), and
    its cross-tokenizer path where its tokenizer is not ``tokenizer``."""
    teacher_tokenizer = teacher_tokenizer_for(entry.spec, distill, tokenizer, main=False)
    # An unresolved auto (outside a run: notebooks, the benchmark) is the online teacher.
    cached = entry.cache not in (None, "auto") and data is not None
    spec = entry.spec
    source = None if teacher_tokenizer is None else tokenizer.name_or_path  # the student's
    if cached:  # loaded as its cache's writer loaded it, for the weights digest
        with entry_cache_errors(entry, source):
            spec = replace(spec, dtype=CachedTeacher.stored_dtype(entry.cache))
    model = load_teacher(spec, precision)
    if spec.quantize is not None:  # before its cache opens: the writer's digest is of int8 weights
        quantize_teacher(model, spec.quantize)
    cross = None
    if teacher_tokenizer is not None:
        cross = CrossTokenizer.for_models(tokenizer, teacher_tokenizer, student, model, distill)
        if data is not None:
            judge_first_blocks(cross, data, entry.domains, entry.name)
    elif tokenizer is not None:  # it reads the run's ids: an embedding's IndexError otherwise
        check_entry_vocabulary(entry, model, len(tokenizer))
    if not cached:
        return model, cross
    args = (entry.cache, model, tokenizer, data, distill.temperature, (), cross)
    with entry_cache_errors(entry, source):
        cache = CachedTeacher.for_run(*args)
    del model
    gc.collect()
    return cache, cross


def check_entry_vocabulary(entry: TeacherEntry, model: nn.Module, needed: int) -> None:
    """Refuse an entry that reads the run's token ids with fewer embedding rows than ids."""
    size = model.get_input_embeddings().num_embeddings
    if size < needed:
        raise Refused(
            f"teachers entry {entry.name!r}: its vocabulary has {size} rows but the run's "
            f"tokenizer has {needed} tokens, so it cannot read the run's ids: give it a model of "
            "that tokenizer, or one with its own tokenizer (the entry then takes the "
            "cross-tokenizer path)"
        )


@contextmanager
def entry_cache_errors(entry: TeacherEntry, source: str | None = None) -> Iterator[None]:
    """A cache refusal of a ``teachers`` entry, naming the entry and how to write *its* cache
    (the reader's advice wrote the main teacher's), with ``source``, the student tokenizer's
    model where the entry reads another (``student.source``: else, a cache of the entry's),
    named as users name it (``smollm2``, not its private conversion: looked up on refusal only)."""
    try:
        yield
    except CacheError as error:
        source = source and (packaged_name(source) or source)
        raise type(error)(
            f"teachers entry {entry.name!r} (cache {entry.cache}): {reader_finding(error)}\n"
            f"Write this entry's cache with `{entry_cache_command(entry, source)}` and the run's "
            "data overrides, or set its cache to auto or null (online)"
        ) from None


def reader_finding(error: CacheError) -> str:
    """What the cache reader found, without its advice: that advice writes the teacher group's
    cache, and an entry's is written with the entry's own command."""
    found = str(error)
    for advice in ("write one with `", "\nUse the cache written for", "rebuild it for"):
        found = found.split(advice)[0].rstrip("; :")
    return found


def entry_cache_command(entry: TeacherEntry, source: str | None) -> str:
    """The ``lightning-kd cache`` command of ``entry``'s cache: its teacher keys, logits only (an
    entry's cache serves no features and no repair: without ``distill.features=null`` the
    command refused a teacher of another tokenizer), into a directory of its own. Not
    ``overwrite=true`` into the entry's ``cache``: that directory may be a cache the run reads
    for another teacher (probe 38: following the advice replaced the main teacher's)."""
    model = [*teacher_overrides(entry.spec), "distill.features=null", "distill.blockwise_passes=0"]
    student = [f"student.source={source}"] if source else []
    directory = f"hydra.run.dir={entry.cache}"
    if (Path(str(entry.cache)) / INDEX_NAME).is_file():  # a whole cache, of something else
        directory = f"hydra.run.dir={entry.cache}-{entry.name}"
    words = ["lightning-kd", "cache", *model, *student, directory]
    return " ".join(shlex.quote(word) for word in words)


def teacher_overrides(spec: TeacherSpec) -> list[str]:
    """The ``teacher.*`` overrides that rebuild ``spec`` in another command over any config:
    every key, since a cache is keyed by them all and the command's own config (``debug=smoke``,
    an experiment) may set any of them otherwise (written without ``teacher.init_seed``, a
    ``config`` teacher's cache was of other weights, and refused). A config is nulled first:
    a dict given over another merges into it, keeping keys the entry does not have."""
    model = ["teacher.path=" + spec.path, "teacher.config=null"] if spec.path else []
    if spec.config is not None:
        model = ["teacher.path=null", "teacher.config=null"]
        model.append("teacher.config=" + hydra_value(spec.config))
    keys = [f.name for f in dataclasses.fields(spec) if f.name not in ("path", "config")]
    return model + [f"teacher.{key}={hydra_value(getattr(spec, key))}" for key in keys]


def hydra_value(value: object) -> str:
    """``value`` as a Hydra override writes it (``{a: 1, b: [x, y]}``, ``null``, ``true``)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hydra_value(item) for item in value) + "]"
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = str(value)
    plain = isinstance(value, int | float) or re.fullmatch(r"[A-Za-z_][\w./-]*", text)
    return text if plain and text not in ("null", "true", "false") else repr(text)
