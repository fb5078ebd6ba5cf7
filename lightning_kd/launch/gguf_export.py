"""``export.gguf``: the run's student as a GGUF beside its Hugging Face export.

Checked before anything loads or trains (:func:`gguf_errors`: the student's architecture read
from the config alone, the tokenizer it is exported with), written after the ``save_pretrained``
export (:func:`export_gguf`) from that directory, as ``lightning-kd export`` converts one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from transformers import AutoConfig, PretrainedConfig

from lightning_kd.export.gguf import export_saved, writable_errors
from lightning_kd.export.gguf_names import GGUF_KINDS, gguf_path
from lightning_kd.launch.rules import lookup
from lightning_kd.models.loading import StudentSpec, TeacherSpec
from lightning_kd.models.sources import checked_model_path, teacher_dir
from lightning_kd.models.student import run_tokenizer
from lightning_kd.utils.refusal import Refused

KEY = "export.gguf"


def gguf_kind(cfg: Mapping) -> str | None:
    """``export.gguf`` when it asks for a GGUF this package writes (None: off, absent or bad —
    a bad value is ``checks.py``'s to refuse)."""
    kind = lookup(cfg, KEY)
    return kind if isinstance(kind, str) and kind in GGUF_KINDS else None


def gguf_errors(cfg: Mapping) -> list[str]:
    """Why the student of ``cfg`` could not be written as a GGUF, found before the run trains:
    its architecture (from configs, no weights) and the run's tokenizer it is saved with (the
    student's own where it has one: ``models.student.run_tokenizer``)."""
    if gguf_kind(cfg) is None or lookup(cfg, "export_student") is False:
        return []
    try:
        teacher = instantiate(cfg["teacher"], _convert_="all")
        student = instantiate(cfg["student"], _convert_="all")
        config = student_config(teacher, student)
        errors = writable_errors(config, lambda: run_tokenizer(teacher, student))
    except Refused as refused:
        errors = [str(refused)]
    except (ValueError, OSError, InstantiationException):
        return []  # a bad teacher or student spec: refused by its own check, as without a GGUF
    return [f"{KEY}={gguf_kind(cfg)}: {error} (or {KEY}=null: no GGUF)" for error in errors]


def student_config(teacher: TeacherSpec, student: StudentSpec) -> PretrainedConfig:
    """The config the run's student will have: ``student.path``'s, or the teacher's with
    ``student.config``'s overrides (a copied student keeps the teacher's architecture)."""
    if student.path is not None:
        location = checked_model_path(student.path, "student.path")
        return AutoConfig.from_pretrained(location, trust_remote_code=student.trust_remote_code)
    if student.source is not None:
        config = AutoConfig.from_pretrained(teacher_dir(student.source))
        config.num_hidden_layers = len(student.layers or []) or student.num_layers
        return config
    if teacher.config is not None:
        overrides = dict(teacher.config)
        config = AutoConfig.for_model(overrides.pop("model_type"), **overrides)
    else:
        location = teacher_dir(teacher.path, teacher.gguf_file)
        config = AutoConfig.from_pretrained(location, trust_remote_code=teacher.trust_remote_code)
    for key, value in (student.config or {}).items():
        setattr(config, key, value)
    return config


def export_gguf(cfg: Mapping, student_dir: Path, then: str) -> Path | None:
    """Write ``export.gguf``'s GGUF of the exported student in ``student_dir`` (on rank 0, where
    the export is written); ``then`` follows a full disk. Returns its path (None: not asked)."""
    kind = gguf_kind(cfg)
    if rank_zero_only.rank != 0:
        return None
    for other in GGUF_KINDS:  # a resumed run's earlier GGUF is of the student before it trained
        stale = gguf_path(student_dir, other)
        if other != kind and stale.is_file():
            stale.unlink()
            print(f"removed {stale}: the GGUF of the student before this run's last steps")
    if kind is None:
        return None
    path = export_saved(student_dir, kind, then=then)
    print(f"GGUF ({kind}) of the student: {path}")
    return path
