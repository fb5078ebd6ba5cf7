"""``lightning-kd export`` and ``evaluate`` answer ``--help`` and a mistyped option before
torch, transformers and Lightning load (they took 6 to 8 s to print their help on a 2-core CPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "lightning", "hydra")

PROBE = """
import json, sys
from lightning_kd.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
print(json.dumps([status, sorted(m for m in {heavy!r} if m in sys.modules)]))
"""


def loaded_after(argv: list[str]) -> tuple[int, list[str], str]:
    """The exit status of ``lightning-kd argv`` in a new interpreter, the heavy packages it
    imported, and what it printed."""
    code = PROBE.format(heavy=HEAVY)
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False
    )
    status, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return status, loaded, done.stdout + done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--help"],
        ["evaluate", "--help"],
        ["export", "runs/kd/student", "--gguf", "q4_k"],
        ["evaluate", "--prompts", "p.jsonl", "--", "runs/kd/student"],
    ],
    ids=["export help", "evaluate help", "export bad type", "evaluate prompts without teacher"],
)
def test_help_and_bad_options_load_no_framework(argv) -> None:
    status, loaded, printed = loaded_after(argv)
    assert loaded == [], printed
    if "--help" in argv:
        assert status == 0 and f"lightning-kd {argv[0]}" in printed
    else:
        assert status == 2 and ("invalid choice: 'q4_k'" in printed or "needs --teacher" in printed)
