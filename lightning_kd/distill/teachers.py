"""Several teachers: the ``teachers`` list, each with its weight, same- or cross-tokenizer.

The distiller's own teacher (the ``teacher`` group's model, online or from its cache) is one
entry of the list; the others are held here, frozen, each with its own tokenizer path where its
tokenizer is not the student's. A step adds, for each of them, its weighted divergence term over
the same student positions, without CE (which the first term carries once):

    loss = kd_weight · Σ_t w_t · KD_t + ce_weight · CE    (Σ_t w_t = 1)

so the exact token-sum accumulation sees one objective; each teacher's own divergence is reported
beside it (``train/kd/<name>``). Each extra term runs the student's head again, a chunk at a time.
"""

from __future__ import annotations

import difflib
import gc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from lightning_kd.cache.teacher import CachedTeacher
from lightning_kd.distill.cross_tokenizer import CrossTokenizer
from lightning_kd.distill.objective import DistillConfig
from lightning_kd.distill.teacher_domains import rows_of
from lightning_kd.distill.tokenizer_pairs import teacher_tokenizer_for
from lightning_kd.models.digests import config_digest, weights_digest
from lightning_kd.models.heads import final_hidden, output_head
from lightning_kd.models.loading import TeacherSpec, load_teacher
from lightning_kd.utils.refusal import refuse

ENTRY_KEYS = ("name", "weight", "cache", "domains")
"""What a ``teachers`` entry holds besides ``teacher`` keys (``models/loading.py``)."""


@dataclass(frozen=True)
class TeacherEntry:
    """One entry of ``teachers``: its name in logs, its weight, and the model (``spec``)."""

    name: str
    weight: float
    spec: TeacherSpec
    main: bool
    """Whether it is the ``teacher`` group's model (the entry that names no model of its own)."""
    domains: tuple[str, ...] | None = None
    """The ``data.domains`` it teaches (None: every row; ``teacher_domains.py``)."""
    cache: str | None = None
    """Its teacher cache (``lightning-kd cache`` with this entry's ``teacher`` keys), or ``auto``
    (written once, like ``distill.teacher_cache=auto``); None: online. The main entry's is
    ``distill.teacher_cache``."""


def teacher_entries(teachers: Any, main: TeacherSpec) -> list[TeacherEntry] | None:
    """The ``teachers`` list checked — each entry a ``name``, a ``weight`` and ``teacher`` keys
    over the ``teacher`` group's (one entry with no ``path``/``config`` is that model itself),
    the weights summing to 1 — or :class:`~lightning_kd.utils.refusal.Refused` naming every
    problem. None for no list, or a list of one: the teacher group's model alone."""
    entries, errors = read_entries(teachers, main)
    refuse(errors)
    return entries if len(entries) > 1 else None


def read_entries(teachers: Any, main: TeacherSpec) -> tuple[list[TeacherEntry], list[str]]:
    """The entries of ``teachers`` that read, and one message per problem with any of them."""
    if teachers is None or (isinstance(teachers, Sequence) and not len(teachers)):
        return [], []
    if isinstance(teachers, str | Mapping) or not isinstance(teachers, Sequence):
        return [], [f"teachers={teachers!r}: give a list of entries, e.g. {EXAMPLE}"]
    entries, errors = [], []
    for index, entry in enumerate(teachers):
        found, why = read_entry(entry, index, main)
        errors += why
        entries += [found] if found is not None else []
    if not errors:
        errors += entries_errors(entries)
    return entries, errors


EXAMPLE = "teachers=[{name: smollm2, weight: 0.5}, {name: gemma, weight: 0.5, path: gemma3_270m}]"


def read_entry(entry: Any, index: int, main: TeacherSpec) -> tuple[TeacherEntry | None, list]:
    """``teachers[index]`` as an entry, or None and why not (every reason at once)."""
    if not isinstance(entry, Mapping):
        return None, [f"teachers[{index}]={entry!r}: give a mapping, e.g. {{name: a, weight: 0.5}}"]
    allowed = [*ENTRY_KEYS, *(field.name for field in fields(TeacherSpec))]
    errors = []
    for key in sorted(set(map(str, entry)) - set(allowed)):
        near = difflib.get_close_matches(key, allowed, n=1)
        hint = f"did you mean {near[0]}?" if near else f"allowed: {', '.join(allowed)}"
        errors.append(f"teachers[{index}].{key}: an entry takes no key {key!r}; {hint}")
    errors += [
        f"teachers[{index}] has no {key}: each entry needs a name and a weight, e.g. "
        "{name: gemma, weight: 0.5, path: gemma3_270m}"
        for key in ("name", "weight")
        if entry.get(key) is None
    ]
    overrides = teacher_keys(entry)
    own = overrides.get("path") is not None or overrides.get("config") is not None
    if "path" in entry and entry["path"] is None and entry.get("config") is None:
        errors.append(
            f"teachers[{index}].path=null: give the model's path (or config), or leave both "
            "keys out for the teacher group's model"
        )
    if not own and entry.get("cache") is not None:
        errors.append(
            f"teachers[{index}].cache: this entry is the teacher group's model, whose cache is "
            "distill.teacher_cache; set distill.teacher_cache instead of its entry's cache"
        )
    if errors:
        return None, errors
    try:
        weight = entry_weight(entry["weight"], index)
        domains = entry_domains(entry.get("domains"), index)
    except ValueError as error:
        return None, [str(error)]
    spec = replace(main, **overrides)
    return TeacherEntry(str(entry["name"]), weight, spec, not own, domains, entry.get("cache")), []


def entry_weight(weight: Any, index: int) -> float:
    """An entry's ``weight``: a finite number (a NaN would pass every comparison below)."""
    try:
        value = float(weight)
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(weight, bool) or not math.isfinite(value):
        raise ValueError(
            f"teachers[{index}].weight={weight!r}: give a number >= 0, the weights summing to 1, "
            "e.g. weight: 0.5"
        )
    return value


def entry_domains(domains: Any, index: int) -> tuple[str, ...] | None:
    """An entry's ``domains``: None, or a non-empty list of domain names."""
    if domains is None:
        return None
    if isinstance(domains, str) or not domains or not all(isinstance(d, str) for d in domains):
        raise ValueError(
            f"teachers[{index}].domains={domains!r}: list the data.domains it teaches, e.g. "
            "domains: [code]"
        )
    return tuple(domains)


def teacher_keys(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The ``teacher`` keys ``entry`` sets over the teacher group's: for a model of its own (a
    ``path`` or ``config``), the other of those two and ``gguf_file`` are not inherited."""
    overrides = {k: v for k, v in entry.items() if k not in ENTRY_KEYS}
    if "path" in overrides or "config" in overrides:
        overrides = {"path": None, "config": None, "gguf_file": None} | overrides
    return overrides


def entries_errors(entries: list[TeacherEntry]) -> list[str]:
    """One main entry, distinct names, non-negative weights that sum to 1, causal LMs only, and
    no domains where one teacher teaches every row."""
    errors = []
    names = [entry.name for entry in entries]
    if sum(entry.main for entry in entries) != 1:
        errors.append(
            "teachers lists every teacher, the teacher group's model among them exactly once "
            "(the entry with no path or config of its own, e.g. {name: smollm2, weight: 0.5})"
        )
    if len(set(names)) != len(names):
        errors.append(f"teachers: names {names} repeat; give each entry its own name")
    weights = [entry.weight for entry in entries]
    if min(weights) < 0 or abs(sum(weights) - 1.0) > 1e-6:
        errors.append(
            f"teachers: weights {weights} must be >= 0 and sum to 1 (they share kd_weight)"
        )
    if any(entry.spec.task != "causal_lm" for entry in entries):
        errors.append("teachers: several teachers distil causal LMs' logits only")
    if len(entries) == 1 and entries[0].domains is not None:
        errors.append(
            "teachers: one entry with domains; a single teacher teaches every row, so drop its "
            "domains (or add the teachers of the other domains)"
        )
    return errors


class ExtraTeachers(nn.Module):
    """The teachers besides the distiller's own, each frozen online or read from its cache, with
    their weights and tokenizer paths."""

    def __init__(
        self,
        names: list[str],
        weights: list[float],
        sources: list[nn.Module | CachedTeacher],
        crosses: list[CrossTokenizer | None],
    ) -> None:
        super().__init__()
        self.names, self.weights, self.crosses = names, weights, crosses
        # Keyed by position: a module's name may not hold a dot, a teacher's may (qwen2.5).
        self.models = nn.ModuleDict(
            {
                str(index): model.requires_grad_(False).eval()
                for index, model in enumerate(sources)
                if is_model(model)
            }
        )
        self.caches = {
            name: source
            for name, source in zip(names, sources, strict=True)
            if not is_model(source)
        }
        """Name → the cache of each teacher that is not run: its model was released once its
        cache was opened, before the next teacher loaded."""

    @classmethod
    def load(
        cls,
        entries: list[TeacherEntry],
        distill: DistillConfig,
        tokenizer: PreTrainedTokenizerBase | None,
        student: nn.Module,
        precision: str | None = None,
        data: Any = None,
    ) -> ExtraTeachers:
        """The non-main ``entries``' models, each loaded as a teacher is, one at a time: a cached
        one (given the run's set-up ``data`` to match its cache to) released as soon as its cache
        is open, so that cached teachers are never resident at once."""
        sources, crosses, others = [], [], [entry for entry in entries if not entry.main]
        for entry in others:
            source, cross = teacher_source(entry, distill, tokenizer, student, precision, data)
            sources.append(source)
            crosses.append(cross)
        names, weights = [e.name for e in others], [e.weight for e in others]
        return cls(names, weights, sources, crosses)

    def digests(self) -> dict[str, dict[str, str]]:
        """Name → the digests of each teacher's weights and config, as it runs (a cached one's as
        its cache records them), for the checkpoints' record (``training/provenance.py``)."""
        found = {}
        for index, name in enumerate(self.names):
            if name in self.caches:
                key = self.caches[name].key
                found[name] = {"weights": key.teacher_weights, "config": key.teacher_config}
            else:
                model = self.model(index)
                found[name] = {
                    "weights": weights_digest(model),
                    "config": config_digest(model.config),
                }
        return found

    def model(self, index: int) -> nn.Module | None:
        """Teacher ``index``'s model, or None where its cache stands in for it."""
        key = str(index)
        return self.models[key] if key in self.models else None  # noqa: SIM401 (no .get)

    def train(self, mode: bool = True) -> ExtraTeachers:
        """Teachers stay in eval mode whatever the distiller's mode."""
        return super().train(False)

    @torch.no_grad()
    def output(self, index: int, batch: dict[str, Tensor], temperature: float, split="train"):
        """Teacher ``index``'s hidden states on ``batch`` (its records, across tokenizers or
        from its cache: ``batch`` holds blocks of ``split``)."""
        name, cross = self.names[index], self.crosses[index]
        if name in self.caches:
            return self.caches[name].records(batch, split)[0]
        model = self.model(index)
        if cross is not None:
            return cross.records(model, output_head(model), batch, temperature)
        return final_hidden(model, batch, logits=False)

    def sides(
        self, task, batch: dict[str, Tensor], student_head, split="train", rows=None
    ) -> list[tuple]:
        """``(name, output, heads, rows)`` of each teacher on ``batch``: what its term compares
        the student with, the (student, teacher) heads (no teacher head for records) and the
        rows it ran on: ``rows[i]`` (None: every row; no rows: the teacher is not run)."""
        found = []
        for index, name in enumerate(self.names):
            ran_on = None if rows is None else rows[index]
            teacher_out = None
            if ran_on is None or len(ran_on):
                own = batch if ran_on is None else rows_of(batch, ran_on)
                teacher_out = self.output(index, own, task.objective.temperature, split)
            runs_head = self.model(index) is not None and self.crosses[index] is None
            head = output_head(self.model(index)) if runs_head else None
            found.append((name, teacher_out, (student_head, head), ran_on))
        return found

    def terms(self, task, student_out: Tensor, batch: dict[str, Tensor], student_head) -> tuple:
        """Σ of each extra teacher's weighted divergence term (differentiable, no CE) and each
        one's own divergence sum, by name."""
        total, kd = None, {}
        sides = self.sides(task, batch, student_head)
        for (name, teacher_out, heads, _), weight in zip(sides, self.weights, strict=True):
            value, sums = task.logit_terms(
                student_out, teacher_out, batch, heads, ce=False, kd_scale=weight
            )
            total = value if total is None else total + value
            kd[name] = sums.kd
        return total, kd

    @torch.no_grad()
    def evaluation_sums(
        self, task, student_out: Tensor, batch, heads, main: tuple[str, dict]
    ) -> dict:
        """Validation: each teacher's own KL from the student (T = 1, ``kl/<name>``) and top-1
        agreement with it (``agreement/<name>``), as token sums and counts; ``heads`` are the
        distiller's, ``main`` its own name and the metrics it already measured against it."""
        name, measured = main
        found = per_teacher(name, measured)
        for name, teacher_out, theirs, _ in self.sides(task, batch, heads[0], "val"):
            found |= per_teacher(name, task.metric_sums(student_out, teacher_out, batch, theirs))
        return found


def per_teacher(name: str, metrics: dict) -> dict:
    """``metrics``' KL and agreement under ``<metric>/<name>``."""
    return {f"{key}/{name}": metrics[key] for key in ("kl", "agreement") if key in metrics}


def is_model(source: nn.Module | CachedTeacher) -> bool:
    return isinstance(source, nn.Module)


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
    if cached:  # loaded as its cache's writer loaded it, for the weights digest
        spec = replace(spec, dtype=CachedTeacher.stored_dtype(entry.cache))
    model = load_teacher(spec, precision)
    cross = None
    if teacher_tokenizer is not None:
        cross = CrossTokenizer.for_models(tokenizer, teacher_tokenizer, student, model, distill)
    if not cached:
        return model, cross
    args = (entry.cache, model, tokenizer, data, distill.temperature, (), cross)
    cache = CachedTeacher.for_run(*args)
    del model
    gc.collect()
    return cache, cross
