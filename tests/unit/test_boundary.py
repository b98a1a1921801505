"""Shared code names no system and no framework: it asks the System (tf_tput.systems)
and its framework's runtime (tf_tput/frameworks/), so a new system is its own module
plus a REGISTRY line (docs/extending.md).

Checked in the code itself: imports, names and string literals. Docstrings and
comments may give examples (`--system=jax`) and are not checked."""

import ast
import io
import pathlib
import re
import tokenize

import pytest

from tf_tput import PACKAGE_DIR, systems

SHARED = ["train.py", "launch.py", "suite", "measure", "records", "runtime"]
FRAMEWORK_MODULES = {"tensorflow", "jax", "jaxlib", "torch", "ray", "mesh_tensorflow",
                     "optax", "gin.tf"}
# Words that name a framework or a system: the registered systems, the runtimes
# (tf_tput/frameworks/*_runtime.py) and the frameworks behind them.
RUNTIMES = sorted(p.stem[:-len("_runtime")]
                  for p in (PACKAGE_DIR / "frameworks").glob("*_runtime.py"))
NAMES = sorted(set(systems.REGISTRY) | set(RUNTIMES) | {
    "tensorflow", "TensorFlow", "TF", "JAX", "mesh_tensorflow", "torch", "PyTorch",
    "Ray", "ray"})
WORD = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, NAMES)) + r")(?![A-Za-z0-9_])")


def _shared_files() -> list:
  out = []
  for name in SHARED:
    path = PACKAGE_DIR / name
    out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
  return out


def _docstring_lines(tree: ast.AST) -> set:
  lines = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        lines.update(range(body[0].lineno, body[0].end_lineno + 1))
  return lines


def namings(source: str) -> list:
  """(line, text) of every import of a framework or of a system's or runtime's own
  module, and every name or string literal (docstrings aside) naming one."""
  tree = ast.parse(source)
  found = []
  for node in ast.walk(tree):
    modules = []
    if isinstance(node, ast.Import):
      modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    for module in modules:
      if (module.split(".")[0] in FRAMEWORK_MODULES or module in FRAMEWORK_MODULES
          or module.startswith(("tf_tput.frameworks", "tf_tput.systems."))):
        found.append((node.lineno, f"import {module}"))
  docstrings = _docstring_lines(tree)
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type not in (tokenize.NAME, tokenize.STRING) or token.start[0] in docstrings:
      continue
    text = token.string
    if token.type == tokenize.STRING:
      text = text.replace("\\n", " ")
    for match in WORD.finditer(text):
      found.append((token.start[0], f"{match.group(1)!r} in {token.string[:60]}"))
  return found


def test_the_checker_finds_namings():
  source = ('"""Docstrings may say jax and mtf."""\nimport jax\n'
            'from tf_tput.frameworks import tf_runtime\nx = "--system=tf2"  # tf2\n'
            'if framework == "tf": pass\nfrom tf_tput import systems\ny = "tf_tput"\n')
  assert sorted(line for line, _ in namings(source)) == [2, 2, 3, 3, 4, 5]


@pytest.mark.parametrize("path", _shared_files(), ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_shared_code_names_no_system_or_framework(path):
  found = namings(path.read_text())
  assert not found, (f"{path.relative_to(PACKAGE_DIR)} names a system or framework; ask "
                     f"the System or its runtime instead: {found}")
