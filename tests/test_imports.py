"""No import circles among the modules of jaxnorm/ and pallas_kernels/.

The graph is read from the source (`ast`), not from an interpreter run, so
an import made lazily inside a function body, or only under
``typing.TYPE_CHECKING``, counts like one at the top: hiding a circle is not
breaking it. Edges:

* ``import a.b.c`` is an edge to ``a.b.c``;
* ``from a.b import c`` is an edge to the module ``a.b.c`` when there is one,
  else to ``a.b`` (a name from the package's ``__init__``);
* relative imports are resolved against the importing module's package.

A module's parent packages are not edges: Python runs ``a/__init__.py``
before ``a.b``, and a package re-exporting its submodules, which in turn
import each other by their full names, is not a circle. A submodule that
takes a name from its own package's ``__init__`` is one (the ``__init__`` is
half-run at that moment), and is reported.

`jaxnorm._dispatch` imports the kernels by a name string
(`importlib.import_module`, the documented lazy import that lets jaxnorm
import on a CPU-only jaxlib); a string is not an import statement, so that
edge is not in the graph and needs no exception.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("jaxnorm", "pallas_kernels")


def _modules() -> dict[str, pathlib.Path]:
  """Dotted module name -> source file, for every module of PACKAGES."""
  found = {}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      found[".".join(parts)] = path
  return found


def _base(module: str, is_package: bool, level: int) -> str:
  """The package a relative import of ``level`` dots starts from."""
  parts = module.split(".")
  if not is_package:
    parts.pop()
  if level > 1:
    parts = parts[: len(parts) - (level - 1)]
  return ".".join(parts)


def _known(name: str, modules: dict[str, pathlib.Path]) -> str | None:
  """``name`` or its nearest enclosing module of PACKAGES, or None."""
  parts = name.split(".")
  while parts:
    candidate = ".".join(parts)
    if candidate in modules:
      return candidate
    parts.pop()
  return None


def _imports(module: str, modules: dict[str, pathlib.Path]) -> dict[str, int]:
  """The modules of PACKAGES that ``module`` imports -> the first line."""
  path = modules[module]
  is_package = path.name == "__init__.py"
  edges: dict[str, int] = {}

  def add(target: str | None, line: int):
    if target is not None and target != module:
      edges.setdefault(target, line)

  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      for alias in node.names:
        add(_known(alias.name, modules), node.lineno)
    elif isinstance(node, ast.ImportFrom):
      pkg = node.module or ""
      if node.level:
        base = _base(module, is_package, node.level)
        pkg = f"{base}.{pkg}" if pkg else base
      for alias in node.names:
        sub = f"{pkg}.{alias.name}"
        add(sub if sub in modules else _known(pkg, modules), node.lineno)
  return edges


def _graph() -> dict[str, dict[str, int]]:
  modules = _modules()
  return {m: _imports(m, modules) for m in modules}


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
  """One shortest cycle through each strongly connected component."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  components: list[list[str]] = []

  def visit(v: str):  # Tarjan; the graph has a few hundred nodes.
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        components.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)

  cycles = []
  for component in sorted(components):
    members = set(component)
    start = component[0]
    # Breadth-first from start back to start, inside the component.
    paths = {start: [start]}
    frontier = [start]
    cycle = None
    while frontier and cycle is None:
      nxt = []
      for v in frontier:
        for w in sorted(graph[v]):
          if w == start:
            cycle = paths[v] + [start]
            break
          if w in members and w not in paths:
            paths[w] = paths[v] + [w]
            nxt.append(w)
        if cycle is not None:
          break
      frontier = nxt
    cycles.append(cycle)
  return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
  steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle[:-1], cycle[1:])]
  return " -> ".join(steps + [cycle[-1]])


def test_the_graph_sees_the_packages():
  graph = _graph()
  assert "jaxnorm.nn.models" in graph and "pallas_kernels.attention" in graph
  assert "jaxnorm.nn.quant" in graph["jaxnorm.nn.models"]


def test_relative_and_from_imports_resolve():
  modules = {
    "p": pathlib.Path("p/__init__.py"),
    "p.a": pathlib.Path("p/a.py"),
    "p.sub": pathlib.Path("p/sub/__init__.py"),
    "p.sub.b": pathlib.Path("p/sub/b.py"),
  }
  assert _base("p.sub.b", False, 1) == "p.sub"
  assert _base("p.sub.b", False, 2) == "p"
  assert _base("p.sub", True, 1) == "p.sub"
  assert _known("p.sub.b.name", modules) == "p.sub.b"
  assert _known("numpy.linalg", modules) is None


def test_cycle_finder():
  graph = {
    "a": {"b": 1},
    "b": {"c": 2},
    "c": {"a": 3, "d": 4},
    "d": {},
    "e": {"f": 5},
    "f": {"e": 6},
  }
  assert _cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
  assert _describe(["e", "f", "e"], graph) == "e (line 5) -> f (line 6) -> e"
  assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_circles():
  graph = _graph()
  cycles = [_describe(c, graph) for c in _cycles(graph)]
  assert not cycles, "import circles (module (line) -> imported):\n" + (
    "\n".join(cycles)
  )
