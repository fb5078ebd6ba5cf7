"""The ``teachers`` list checked before anything loads: every entry's problems at once
(``distill/teachers.py`` reads them), and the data domains its entries name against
``data.domains`` where the config lists them — found by the run, a wrong domain cost the data's
tokenisation and a teacher's load first."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.utils import instantiate

from lightning_kd.cache.reader import written_dtype
from lightning_kd.distill.teacher_domains import (
    NO_DATA_DOMAINS,
    ON_POLICY_DOMAINS,
    untaught_domains,
    untaught_error,
)
from lightning_kd.distill.teacher_entries import TeacherEntry, read_entries
from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.architecture import architecture_errors
from lightning_kd.models.model_config import config_from
from lightning_kd.utils.plain_data import plain_data


def teachers_errors(cfg: Mapping) -> list[str]:
    """Why ``cfg``'s ``teachers`` list cannot run: each message names its entry and the fix."""
    entries, errors = config_entries(cfg)
    if errors or len(entries) < 2:
        return errors
    if lookup(cfg, "distill.chunked") is False:  # found here, not once the models load
        return ["teachers: several teachers need the chunked loss; drop distill.chunked=false"]
    domains = lookup(cfg, "data.domains")
    errors = domain_errors(entries, None if domains is ABSENT else domains, cfg)
    return errors + entry_config_errors(entries)


def config_entries(cfg: Mapping) -> tuple[list[TeacherEntry], list[str]]:
    """``cfg``'s ``teachers`` entries that read over its teacher group's model, and one message
    per problem with any; none without a list, or where the teacher group itself does not build
    (the checks that read it name why)."""
    teachers = lookup(cfg, "teachers")
    if teachers is ABSENT or teachers is None:
        return [], []
    try:
        main = instantiate(cfg["teacher"], _convert_="all")
    except Exception:
        return [], []
    return read_entries(plain_data(teachers), main)


def entry_config_errors(entries: Sequence[TeacherEntry]) -> list[str]:
    """Each entry's own ``config`` (a model of its own built from config alone, not merged with
    the teacher group's) that does not build, or builds no causal LM; found by the run, it was
    refused as ``teacher.config`` once the processes had started, after the main teacher."""
    errors = []
    for index, entry in enumerate(entries):
        if entry.main or entry.spec.config is None:
            continue
        key = f"teachers[{index}].config"
        if "model_type" not in entry.spec.config:  # read as overrides of teacher.config
            errors.append(
                f"{key} needs model_type: an entry's config is its model's whole config, not "
                "changes to teacher.config (e.g. {model_type: llama, num_hidden_layers: 3, ...})"
            )
            continue
        built, wrong = config_from(entry.spec.config, None, key)
        errors += wrong or architecture_errors(built, entry.spec.task, key)
    return errors


def domain_errors(entries: Sequence[TeacherEntry], domains: Any, cfg: Mapping) -> list[str]:
    """The entries' ``domains`` against ``data.domains`` (``{name: [files]}``): each a domain
    of the data, every domain of the data taught by a teacher. With ``data.domain_field`` the
    names are the data's own, known once it is read (the run checks them then)."""
    naming = [entry for entry in entries if entry.domains is not None]
    if not naming:
        return []
    if lookup(cfg, "distill.on_policy") not in (None, ABSENT, 0):  # found before both load
        return [ON_POLICY_DOMAINS]
    if domains is None:
        if lookup(cfg, "data.domain_field") not in (None, ABSENT):
            return []
        return [NO_DATA_DOMAINS]
    if not isinstance(domains, Mapping):
        return []  # data.domains' own shape is the data checks' to name
    names = [str(name) for name in domains]
    errors = []
    for index, entry in enumerate(entries):
        for domain in entry.domains or ():
            if domain not in names:
                near = difflib.get_close_matches(domain, names, n=1)
                hint = f"did you mean {near[0]!r}? " if near else ""
                errors.append(
                    f"teachers[{index}] ({entry.name}).domains names {domain!r}, which "
                    f"data.domains does not have; {hint}the data's domains: {', '.join(names)}"
                )
    if untaught := untaught_domains(entries, names):
        errors.append(untaught_error(untaught))
    return errors


def held_precisions(cfg: Mapping, entries: Sequence[TeacherEntry] | None) -> dict[str, str]:
    """For the summary's precision row, how the models are held where not as the trainer's
    precision says: ``{"student.dtype": "bfloat16"}`` for a student's weights in another dtype
    (left out: the row read ``32-true``; probe 55), ``{"quantize": "int8"}`` when the teacher is
    quantized, and for each other ``teachers`` entry held otherwise than the main teacher,
    ``quantize[<name>]`` (``int8``, or ``full-precision``) and ``dtype[<name>]`` (its own
    ``dtype``: an entry in bfloat16 was left out, the row naming the main teacher's alone)."""
    mode, dtype = cfg["teacher"].get("quantize"), cfg["teacher"].get("dtype")
    student = cfg["student"].get("dtype", "float32")
    found = {"student.dtype": student} if student not in (None, "float32") else {}
    found |= {"quantize": mode} if mode else {}
    for entry in (entry for entry in entries or () if not entry.main):
        if entry.spec.quantize != mode:
            found[f"quantize[{entry.name}]"] = entry.spec.quantize or "full-precision"
        held = written_dtype(entry.cache) if entry.spec.dtype == "auto" else entry.spec.dtype
        if held not in (None, "auto", dtype):  # auto over a cache: loaded as its writer did
            found[f"dtype[{entry.name}]"] = held
    return found
