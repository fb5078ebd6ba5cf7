"""Several values for a key without ``-m``: ``student.layers=0,3`` meant as a list.

Hydra refused it as "Ambiguous value", with a traceback hint and exit 1 (probe 36); it is refused
here with the two ways on, as every other bad override is (exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

MULTIRUN_FLAGS = ("-m", "--multirun")


def sweep_value_errors(argv: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """One message per override of ``overrides`` that gives several values (a sweep's form)
    where ``argv`` runs one job (no ``-m``); parse errors are left to Hydra, which names them."""
    if any(word in MULTIRUN_FLAGS for word in argv):
        return []
    parser = OverridesParser.create()
    errors = []
    for word in overrides:
        try:
            (override,) = parser.parse_overrides([word])
        except OverrideParseException:
            continue
        if override.is_sweep_override():
            key = override.get_key_element()
            values = word.split("=", 1)[1]
            errors.append(
                f"{word} gives several values to a run of one: a list is {key}=[{values}], a "
                f"string with commas {key}='{values}', and a sweep of one run per value takes -m "
                "before the overrides"
            )
    return errors
