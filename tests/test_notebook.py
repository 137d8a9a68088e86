"""The LeNet-5 notebook runs top to bottom on the embedded digits (one epoch) and shows what it
promises: plots, a test accuracy well above chance, the confidently wrong digits."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "lenet5.ipynb"


def test_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(not cell.outputs for cell in code_cells)
    assert all(cell.execution_count is None for cell in code_cells)


@pytest.mark.slow
def test_notebook_runs_on_embedded_digits(tmp_path, monkeypatch):
    monkeypatch.setenv("LENET5_NOTEBOOK_EPOCHS", "1")
    # One torch thread in the kernel: faster than two on a shared 2-core machine.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # "python3" is the kernel of the running interpreter (the venv's): jupyter_client runs a
    # kernelspec's "python" as sys.executable.
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()

    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.output_type == "error"]
    text = "".join(output.get("text", "") for output in outputs)
    assert "1 epochs on" in text
    assert "61,706 parameters" in text
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", text).group(1))
    assert accuracy > 0.5  # one epoch on 3,600 digits; chance is 0.1
    assert re.search(r"\d+ of 1000 test digits are misclassified", text)
    figures = [output for output in outputs if "image/png" in output.get("data", {})]
    # digit grid, class balance, curves, feature maps, confusion matrix, wrong digits
    assert len(figures) == 6
