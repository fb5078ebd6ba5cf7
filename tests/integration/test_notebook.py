"""Both notebooks run top to bottom: quickstart on the smoke config, plain_pytorch on a tiny
teacher."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from lightning_kd.models.precision import probe_hardware, resolve_precision
from tests.conftest import ROOT, TINY_LLAMA


def execute(name: str, parameters: str) -> str:
    """Run ``notebooks/<name>`` with its 'parameters' cell replaced; the text it printed."""
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    cells = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name} needs exactly one cell tagged 'parameters'"
    cells[0].source = parameters
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )
    client.execute()
    return "".join(
        out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", [])
    )


def test_quickstart_notebook_runs_on_smoke_config() -> None:
    # debug=smoke pins fp32; the notebook resolves auto as run.py does
    outputs = execute("quickstart.ipynb", 'OVERRIDES = ["debug=smoke", "trainer.precision=auto"]')
    assert "student perplexity" in outputs and "curves.png" in outputs
    expected = resolve_precision("auto", "float32", probe_hardware("cpu")).precision
    assert f"precision: trainer.precision={expected} " in outputs


def test_plain_pytorch_notebook_trains_without_lightning() -> None:
    """notebooks/plain_pytorch.ipynb on a tiny teacher: accumulation, activation checkpointing and
    the capture lifecycle in a hand-written loop (the notebook asserts each, and that Lightning
    was never imported)."""
    tiny = {"path": None, "config": TINY_LLAMA, "dtype": "float32"}
    outputs = execute(
        "plain_pytorch.ipynb",
        f"TEACHER = {tiny!r}\nSTUDENT_LAYERS = 2\n"
        "STEPS, ACCUMULATE, MICRO_BATCH, BLOCK = 6, 3, 4, 32\nCOMPILE = False",
    )
    assert "held-out perplexity" in outputs
    assert "CaptureError:" in outputs and "exported and reloaded" in outputs
