"""The LeNet-5 notebook runs top to bottom on the embedded digits (one epoch) and shows what it
promises: plots, a test accuracy well above chance, the confidently wrong digits.

The notebook is committed with the outputs of that run, so that it shows its pictures where it
is read; `make notebook` writes them (the run below, with UPDATE_NOTEBOOK=1). Its metadata keeps
a hash of the code cells the outputs came from: a code cell edited since fails here.
"""

import hashlib
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "lenet5.ipynb"
CODE_HASH_KEY = "code_sha256"
# The notebook with its six figures at 60 dpi: about 270 kB (400 kB at matplotlib's 100 dpi).
MAX_NOTEBOOK_BYTES = 300_000


def hash_code_cells(notebook: nbformat.NotebookNode) -> str:
    code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def check_outputs(notebook: nbformat.NotebookNode) -> None:
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.output_type == "error"]
    # No library chatter (seed lines, progress-bar warnings) between the results.
    assert not [output for output in outputs if output.get("name") == "stderr"]
    text = "".join(output.get("text", "") for output in outputs)
    assert "1 epochs on" in text
    assert "61,706 parameters" in text
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", text).group(1))
    assert accuracy > 0.5  # one epoch on 3,600 digits; chance is 0.1
    assert re.search(r"\d+ of 1000 test digits are misclassified", text)
    figures = [output for output in outputs if "image/png" in output.get("data", {})]
    # digit grid, class balance, curves, feature maps, confusion matrix, wrong digits
    assert len(figures) == 6


def test_committed_outputs_come_from_the_committed_code():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert notebook.metadata.get(CODE_HASH_KEY) == hash_code_cells(notebook), (
        "the code cells changed since the outputs were made: run `make notebook`"
    )
    check_outputs(notebook)
    assert NOTEBOOK.stat().st_size < MAX_NOTEBOOK_BYTES


def test_a_changed_code_cell_makes_the_outputs_stale():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code_cell = next(cell for cell in notebook.cells if cell.cell_type == "code")
    code_cell.source += "\nprint('edited')"
    assert hash_code_cells(notebook) != notebook.metadata[CODE_HASH_KEY]


@pytest.mark.slow
def test_notebook_runs_on_embedded_digits(tmp_path, monkeypatch):
    monkeypatch.setenv("LENET5_NOTEBOOK_EPOCHS", "1")
    # One torch thread in the kernel: faster than two on a shared 2-core machine, and the same
    # numbers, so the same pictures, on every run.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # "python3" is the kernel of the running interpreter (the venv's): jupyter_client runs a
    # kernelspec's "python" as sys.executable. No timings, and each cell's printed lines as one
    # output (the kernel splits them at random): the saved notebook changes only with the code.
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        record_timing=False,
        coalesce_streams=True,
        resources={"metadata": {"path": tmp_path}},
    )
    client.execute()
    check_outputs(notebook)
    if os.environ.get("UPDATE_NOTEBOOK"):
        notebook.metadata[CODE_HASH_KEY] = hash_code_cells(notebook)
        nbformat.write(notebook, NOTEBOOK)
