"""What a user installing jaxnorm gets: one version, the licence, types."""

import ast
import importlib.metadata
import pathlib
import tomllib

import jaxnorm

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_one_version():
  # pyproject reads it from jaxnorm.__version__; the installed metadata and
  # the changelog's newest release agree with it.
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert "version" not in project and "version" in project["dynamic"]
  assert importlib.metadata.version("jaxnorm") == jaxnorm.__version__
  changelog = (ROOT / "CHANGELOG.md").read_text()
  assert f"## {jaxnorm.__version__} " in changelog


def test_licence_and_types_ship():
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  assert project["license"]["text"] == "Apache-2.0"
  assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
  for package in ("jaxnorm", "pallas_kernels"):
    assert (ROOT / package / "py.typed").is_file()


def test_library_needs_only_its_declared_dependencies():
  # chex is a test dependency (the dev extra): no library module imports it.
  imported = set()
  for path in [*(ROOT / "jaxnorm").rglob("*.py")]:
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        imported |= {a.name.split(".")[0] for a in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        imported.add(node.module.split(".")[0])
  assert "chex" not in imported
  requires = importlib.metadata.requires("jaxnorm") or []
  core = {r.split(">")[0].split("[")[0] for r in requires if "extra" not in r}
  assert "chex" not in core
