"""The notebooks in colab/ run top to bottom."""

import pathlib

import pytest

# Executes the notebooks top to bottom: CI runs them (-m slow).
pytestmark = pytest.mark.slow

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = sorted(
  (pathlib.Path(__file__).resolve().parents[1] / "colab").glob("*.ipynb")
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path):
  nb = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(
    nb,
    timeout=600,
    kernel_name="python3",
    resources={"metadata": {"path": str(tmp_path)}},
  )
  client.execute()
  errors = [
    o
    for cell in nb.cells
    if cell.cell_type == "code"
    for o in cell.get("outputs", [])
    if o.output_type == "error"
  ]
  assert not errors
