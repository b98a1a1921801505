"""tf_tput's imports go one way (docs/design.md, "Package layout"): no module imports
one that imports it back, directly or through others, at the top, inside a function or
under `if TYPE_CHECKING:` (an import for annotations is still an import)."""

import ast
import functools
import json
import pathlib
import subprocess
import sys

from tf_tput import REPO_ROOT

PACKAGE = pathlib.Path(REPO_ROOT) / "tf_tput"


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set) -> set:
  """The tf_tput modules this file imports (`from tf_tput.x import y` counts as
  tf_tput.x.y when that is a module, else as tf_tput.x)."""
  tree = ast.parse(path.read_text())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        child = f"{node.module}.{alias.name}"
        out.add(child if child in modules else node.module)
  return {name for name in out if name in modules}


def _cycles(graph: dict) -> list:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
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
        found.append(sorted(component))

  for v in graph:
    if v not in index:
      visit(v)
  return found


def test_the_cycle_finder_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def _import_graph() -> dict:
  paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
  modules = set(paths)
  return {name: sorted(_imports(path, modules) - {name}) for name, path in paths.items()}


def test_an_import_for_annotations_counts(tmp_path):
  source = tmp_path / "annotated.py"
  source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "  from tf_tput.config import ModelConfig\n")
  assert _imports(source, {"tf_tput.config"}) == {"tf_tput.config"}


@functools.lru_cache(maxsize=1)  # one child process for both tests
def _parsed_graph() -> dict:
  # Parsed in a fresh process: in this xdist worker ast.parse once failed with "AST
  # constructor recursion depth mismatch (before=144, after=10)". CPython 3.11's AST
  # conversion keeps one recursion counter for all threads, and threads that other
  # tests leave behind may be converting source at the same time (TF's autograph
  # parses functions).
  child = subprocess.run([sys.executable, __file__], capture_output=True, text=True,
                         timeout=120)
  assert child.returncode == 0, child.stderr[-2000:]
  return {name: set(imports) for name, imports in json.loads(child.stdout).items()}


def test_config_pipeline_and_models_import_one_way():
  """config -> pipeline -> models (config validates with both): neither imports
  config, and models imports neither (docs/design.md, "Package layout")."""
  graph = _parsed_graph()
  assert {"tf_tput.models", "tf_tput.pipeline"} <= graph["tf_tput.config"]
  assert "tf_tput.config" not in graph["tf_tput.pipeline"]
  assert not {"tf_tput.config", "tf_tput.pipeline"} & graph["tf_tput.models"]


# measure/ sits below systems/ and runtime/: a caller passes what it needs of them (a
# Runtime, a Topology, gemm.choose's probe). What it still reads of runtime/ directly:
# this process's CPUs (runtime/cpus.py) and its launcher's CPU binding
# (runtime/topology.launched), which the CPU peak and its store are keyed by.
MEASURE_READS_OF_RUNTIME = {
    "tf_tput.measure.peak": {"tf_tput.runtime.cpus", "tf_tput.runtime.topology"},
    "tf_tput.measure.peak_store": {"tf_tput.runtime.cpus"},
}


def test_measure_imports_nothing_above_it():
  graph = _parsed_graph()
  measure = {name: imported for name, imported in graph.items()
             if name.split(".")[:2] == ["tf_tput", "measure"]}
  assert "tf_tput.measure.gemm" in measure
  above = {name: sorted(m for m in imported if m.split(".")[1:2] in (["systems"], ["runtime"])
                        and m not in MEASURE_READS_OF_RUNTIME.get(name, ()))
           for name, imported in measure.items()}
  assert not any(above.values()), (
      f"tf_tput/measure imports from systems/ or runtime/, which sit above it; pass what "
      f"it needs from the caller instead: { {k: v for k, v in above.items() if v} }")


def test_no_module_imports_one_that_imports_it_back():
  graph = _parsed_graph()
  mtf = "tf_tput.systems.tensorflow.mtf"
  assert graph[f"{mtf}.system"] == {"tf_tput.errors", "tf_tput.systems", f"{mtf}.tpu",
                                    f"{mtf}.pipeline", f"{mtf}.trainer",
                                    "tf_tput.systems.tensorflow.runtime"}
  assert _cycles(graph) == []


if __name__ == "__main__":
  print(json.dumps(_import_graph()))
