"""Optional packages a config needs, checked before anything loads: ``student.lora`` runs on
peft, ``teacher.quantize`` on torchao (a ``teachers`` entry's own ``quantize`` is named by the
entries' check, ``teacher_list.py``). Found by the run, a missing one was an ImportError
traceback once the data was read (peft) or Hydra's wrapped error as the teacher's settings were
read (torchao)."""

from __future__ import annotations

from collections.abc import Mapping

from lightning_kd.launch.rules import ABSENT, lookup
from lightning_kd.models.lora import missing_peft
from lightning_kd.models.quantize import missing_torchao


def package_errors(cfg: Mapping) -> list[str]:
    """One message per optional package ``cfg`` needs and this environment lacks, each naming
    the extra that installs it."""
    errors = []
    if lookup(cfg, "student.lora") not in (None, ABSENT) and (message := missing_peft()):
        errors.append(message)
    mode = lookup(cfg, "teacher.quantize")
    if mode is not ABSENT and (message := missing_torchao(mode)):
        errors.append(message)
    return errors
