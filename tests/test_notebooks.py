"""The notebooks in colab/ run top to bottom."""

import pathlib

import pytest

# Executes the notebooks top to bottom: CI runs them (-m slow).
pytestmark = pytest.mark.slow

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))
# One notebook per family (issue 19), besides the quickstart and complex.
FAMILIES = ("norms", "attention", "residual", "optimizers")


def test_every_family_has_a_notebook():
  names = {p.stem for p in NOTEBOOKS}
  assert set(FAMILIES) <= names, sorted(set(FAMILIES) - names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch):
  # The quick form: notebooks read JAXNORM_QUICK and train for a few steps.
  monkeypatch.setenv("JAXNORM_QUICK", "1")
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
