"""Each notebook's first code cell installs jaxnorm in Colab, and only there.

The cell runs here in a simulated Colab: a stand-in ``google.colab`` module,
jaxnorm reported missing, ``subprocess.run`` recorded instead of executed.
"""

import importlib.util
import json
import pathlib
import subprocess
import sys
import types

import pytest

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
NOTEBOOKS = sorted(COLAB.glob("*.ipynb"))


def _cells(path):
  nb = json.loads(path.read_text())
  return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


def _install_cell(path):
  kind, source = _cells(path)[1]
  assert kind == "code", f"{path.name}: the cell after the title is {kind}"
  return source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_install_cell_comes_first_and_is_documented(path):
  (kind, title), *_ = _cells(path)
  assert kind == "markdown" and "JAXNORM_SOURCE" in title
  assert "JAXNORM_SOURCE" in _install_cell(path)
  first_code = next(s for k, s in _cells(path) if k == "code")
  assert first_code == _install_cell(path)


def test_every_notebook_has_the_same_install_cell():
  cells = {p.name: _install_cell(p) for p in NOTEBOOKS}
  assert len(set(cells.values())) == 1, sorted(cells)


def _run_cell(monkeypatch, *, colab, installed, source=None):
  """Executes the install cell; returns the commands it ran."""
  calls = []
  monkeypatch.setattr(
    subprocess, "run", lambda cmd, **kw: calls.append((cmd, kw))
  )
  if colab:
    google = types.ModuleType("google")
    google.colab = types.ModuleType("google.colab")
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", google.colab)
  else:
    monkeypatch.setitem(sys.modules, "google.colab", None)
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    "find_spec",
    lambda name, *a: (
      find_spec(name, *a) if installed or name != "jaxnorm" else None
    ),
  )
  if source is None:
    monkeypatch.delenv("JAXNORM_SOURCE", raising=False)
  else:
    monkeypatch.setenv("JAXNORM_SOURCE", source)
  exec(compile(_install_cell(NOTEBOOKS[0]), "install-cell", "exec"), {})
  return calls


def _pip_args(calls):
  ((cmd, kw),) = calls
  assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
  assert kw == {"check": True}
  return cmd[4:]


def test_installs_a_checkout_in_editable_mode(monkeypatch, tmp_path):
  calls = _run_cell(
    monkeypatch, colab=True, installed=False, source=str(tmp_path)
  )
  assert _pip_args(calls) == ["-q", "-e", f"{tmp_path}[train]"]


@pytest.mark.parametrize(
  "source, requirement",
  [
    (
      "https://example.org/me/jaxnorm.git",
      "jaxnorm[train] @ git+https://example.org/me/jaxnorm.git",
    ),
    (
      "git+https://example.org/me/jaxnorm.git@v0.1.0",
      "jaxnorm[train] @ git+https://example.org/me/jaxnorm.git@v0.1.0",
    ),
  ],
)
def test_installs_from_a_git_url(monkeypatch, source, requirement):
  calls = _run_cell(monkeypatch, colab=True, installed=False, source=source)
  assert _pip_args(calls) == ["-q", requirement]


def test_defaults_to_the_colab_checkout_path(monkeypatch):
  # No /content/jaxnorm here, and no URL: the error names the variable.
  with pytest.raises(FileNotFoundError, match="JAXNORM_SOURCE='/content"):
    _run_cell(monkeypatch, colab=True, installed=False)


def test_rejects_a_source_that_is_neither_folder_nor_url(monkeypatch):
  with pytest.raises(FileNotFoundError, match="neither a folder nor a git"):
    _run_cell(monkeypatch, colab=True, installed=False, source="jaxnrom")


@pytest.mark.parametrize(
  "colab, installed", [(False, False), (False, True), (True, True)]
)
def test_does_nothing_outside_colab_or_when_installed(
  monkeypatch, colab, installed
):
  assert not _run_cell(
    monkeypatch,
    colab=colab,
    installed=installed,
    source="https://example.org/me/jaxnorm.git",
  )
