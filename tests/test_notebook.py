"""notebooks/quickstart.ipynb runs top to bottom on the smoke config."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from lightning_kd.precision import probe_hardware, resolve_precision
from tests.conftest import ROOT


def test_quickstart_notebook_runs_on_smoke_config() -> None:
    notebook = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    parameters = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(parameters) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    # debug=smoke pins fp32; the notebook resolves auto as run.py does
    parameters[0].source = 'OVERRIDES = ["debug=smoke", "trainer.precision=auto"]'
    client = NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    )
    client.execute()
    outputs = "".join(
        out.get("text", "") for cell in notebook.cells for out in cell.get("outputs", [])
    )
    assert "student perplexity" in outputs and "curves.png" in outputs
    expected = resolve_precision("auto", "float32", probe_hardware("cpu")).precision
    assert f"precision: trainer.precision={expected} " in outputs
