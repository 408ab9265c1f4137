"""notebooks/fedisyn_scaling_law.ipynb executes top to bottom (tiny pilot runs, the fit, the plot)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO


@pytest.mark.slow  # ~30 s on 2 cores: a notebook kernel running the pilots
def test_scaling_law_notebook_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(REPO / "notebooks" / "fedisyn_scaling_law.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the plot
    assert any("lambda* =" in o.get("text", "") for o in outputs)
    assert any("12 observations" in o.get("text", "") for o in outputs)  # 4 pilots x 3 rounds
