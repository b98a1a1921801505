"""Shared code names no system and no framework: it asks the System (tf_tput.systems)
and its framework's runtime (tf_tput.runtime.Runtime), so a new system is its own
module in its framework's folder plus a REGISTRY line (docs/extending.md).

Checked in the code itself: imports, names and string literals. Docstrings and
comments may give examples (`--system=jax`) and are not checked. The report's modules
that label published results by the paper's system names (published, table1, table2,
document) are checked for imports only; its others are in SHARED. Nothing shared
imports a framework folder (tf_tput/systems/<framework>/) except through the registry.

Shared code also calls the members a System, Runtime or Trainer declares (their
defaults on the base classes) and never probes for one: no hasattr or getattr on them
anywhere in tf_tput outside the framework folders; nor on a micro-benchmark's system
module, which declares tf_tput.micro.MEMBERS."""

import ast
import io
import re
import tokenize

import pytest

from tf_tput import PACKAGE_DIR, micro, systems

# The report's modules that label published figures by the paper's system names; every
# other report module, a new one too, is shared code.
LABELS_PUBLISHED = {"published.py", "table1.py", "table2.py", "document.py"}
SHARED = ["train.py", "request.py", "preflight.py", "run_record.py", "launch.py", "plan.py",
          "suite", "measure", "records", "runtime", "numerics.py", "island_split.py",
          "reduction.py", "gemm_probe.py",
          *(f"report/{p.name}" for p in sorted((PACKAGE_DIR / "report").glob("*.py"))
            if p.name not in LABELS_PUBLISHED)]
IMPORTS_ONLY = ["report"]
FRAMEWORK_MODULES = {"tensorflow", "jax", "jaxlib", "torch", "ray", "mesh_tensorflow",
                     "optax", "gin.tf"}
# tf_tput/systems/<framework>/: the framework folders, reached only through the registry.
FOLDERS = sorted(p.name for p in (PACKAGE_DIR / "systems").iterdir()
                 if (p / "__init__.py").is_file())
FOLDER_MODULE = re.compile(r"tf_tput[./]systems[./](" + "|".join(FOLDERS) + r")\b")
# Words that name a framework or a system: the registered systems, their runtimes'
# names, the folders holding them (tf_tput/systems/**/runtime.py) and the frameworks.
RUNTIMES = sorted({systems.load(name).runtime.name for name in systems.REGISTRY}
                  | {p.parent.name for p in (PACKAGE_DIR / "systems").rglob("runtime.py")})
NAMES = sorted(set(systems.REGISTRY) | set(RUNTIMES) | {
    "tensorflow", "TensorFlow", "TF", "JAX", "mesh_tensorflow", "torch", "PyTorch",
    "Ray", "ray"})
# A name is a word of its own or a part of a snake_case identifier (jax_port); the
# package's own name, tf_tput, is not the runtime "tf".
WORD = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, NAMES)) + r")(?![A-Za-z0-9])")
PACKAGE_NAME = re.compile(r"(?<![A-Za-z0-9])(tf_tput|TF_TPUT)(?![A-Za-z0-9])")
# Launchers' own names, which a launcher's variables carry (runtime/launchers.py): how a
# process was started, not what it trains with.
LAUNCHER_NAMES = re.compile(r"(?<![A-Za-z0-9])(TF_CONFIG|tf_config)(?![A-Za-z0-9])")


def _files(names: list) -> list:
  out = []
  for name in names:
    path = PACKAGE_DIR / name
    out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
  return out


def _module(path) -> str:
  """The dotted name relative imports in a file under PACKAGE_DIR resolve against
  ("tf_tput.runtime.__init__" for a package's own, whose level 1 is the package)."""
  return ".".join(("tf_tput",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts)


def _docstring_lines(tree: ast.AST) -> set:
  lines = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        lines.update(range(body[0].lineno, body[0].end_lineno + 1))
  return lines


def imports(source: str, module: str = "tf_tput.x") -> list:
  """(line, text) of every import of a framework or of a framework folder's module
  (relative imports resolved against `module`), and every string literal
  (docstrings aside) that names a framework folder's module, as a dynamic import would."""
  tree = ast.parse(source)
  found = []
  for node in ast.walk(tree):
    modules = []
    if isinstance(node, ast.Import):
      modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # from ..systems import jax: relative to this module's package
        package = module.split(".")[:-node.level]
        base = ".".join(package + ([base] if base else []))
      modules = [base] + [f"{base}.{a.name}" for a in node.names]
    for name in modules:
      if (name.split(".")[0] in FRAMEWORK_MODULES or name in FRAMEWORK_MODULES
          or FOLDER_MODULE.match(name)):
        found.append((node.lineno, f"import {name}"))
  docstrings = _docstring_lines(tree)
  for node in ast.walk(tree):
    if (isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.lineno not in docstrings and FOLDER_MODULE.search(node.value)):
      found.append((node.lineno, f"{node.value[:60]!r} names a framework folder"))
  return found


def namings(source: str, module: str = "tf_tput.x") -> list:
  """imports(), and every name or string literal (docstrings aside) naming a system
  or framework."""
  found = imports(source, module)
  docstrings = _docstring_lines(ast.parse(source))
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type not in (tokenize.NAME, tokenize.STRING) or token.start[0] in docstrings:
      continue
    text = LAUNCHER_NAMES.sub("", PACKAGE_NAME.sub("", token.string))
    if token.type == tokenize.STRING:
      text = text.replace("\\n", " ")
    for match in WORD.finditer(text):
      found.append((token.start[0], f"{match.group(1)!r} in {token.string[:60]}"))
  return found


def test_the_checker_finds_namings():
  source = ('"""Docstrings may say jax and mtf."""\nimport jax\n'
            'from tf_tput.systems.tensorflow import runtime\nx = "--system=tf2"  # tf2\n'
            'if framework == "tf": pass\nfrom tf_tput import systems\ny = "tf_tput"\n'
            'def jax_port(): pass\nmtf_chief = torch_gemm_path = 1\n')
  assert sorted(line for line, _ in namings(source)) == [2, 2, 3, 3, 3, 4, 5, 8, 9, 9]


def test_the_checker_finds_every_way_to_import_a_framework_folder():
  source = ("from tf_tput.systems import jax, load\n"      # a folder; the registry's load
            "from ..systems.torch import system\n"         # relative, from tf_tput.report
            "import tf_tput.systems.tensorflow.mtf.system\n"
            "importlib.import_module('tf_tput.systems.jax.system')\n"
            "from tf_tput import systems\nsystems.load(name)\n")
  found = imports(source, "tf_tput.report.document")
  assert sorted({line for line, _ in found}) == [1, 2, 3, 4]


@pytest.mark.parametrize("path", _files(SHARED), ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_shared_code_names_no_system_or_framework(path):
  found = namings(path.read_text(), _module(path))
  assert not found, (f"{path.relative_to(PACKAGE_DIR)} names a system or framework; ask "
                     f"the System or its runtime instead: {found}")


@pytest.mark.parametrize("path", _files(IMPORTS_ONLY),
                         ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_shared_code_imports_no_framework_folder(path):
  found = imports(path.read_text(), _module(path))
  assert not found, (f"{path.relative_to(PACKAGE_DIR)} imports a framework or a framework "
                     f"folder; reach a system through tf_tput.systems.load: {found}")


# What a probed object's spelling says it is: a System, Runtime or Trainer (or a
# micro-benchmark's system module, micro.system_module(name)), or systems.load(...).
PROBED = re.compile(r"system|runtime|trainer|\bload\(", re.IGNORECASE)


def probes(source: str) -> list:
  """(line, call) of every hasattr or getattr whose object names a System, Runtime
  or Trainer (PROBED): shared code calls their declared members instead."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr") and node.args
        and PROBED.search(ast.unparse(node.args[0]))):
      found.append((node.lineno, ast.unparse(node)))
  return found


def test_the_probe_checker_finds_probes():
  source = ('dispatch = getattr(trainer, "dispatch", None)\n'
            'offer = getattr(runtime, "gemm_paths", None)\n'
            'x = hasattr(system.runtime, "serve_worker")\n'
            'y = getattr(load(name), "caveat", None)\n'
            'z = [s for s in names if hasattr(micro.system_module(s), "run_private")]\n'
            'fine = getattr(experiment, field.name), hasattr(batches, "close")\n')
  assert [line for line, _ in probes(source)] == [1, 2, 3, 4, 5]


def _outside_framework_folders() -> list:
  """Every module of tf_tput but those in tf_tput/systems/<framework>/, which hold
  the members themselves."""
  return [p for p in sorted(PACKAGE_DIR.rglob("*.py"))
          if p.relative_to(PACKAGE_DIR).parts[:1] != ("systems",)
          or len(p.relative_to(PACKAGE_DIR).parts) == 2]


@pytest.mark.parametrize("path", _outside_framework_folders(),
                         ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_shared_code_never_probes_a_system_runtime_or_trainer(path):
  found = probes(path.read_text())
  assert not found, (f"{path.relative_to(PACKAGE_DIR)} probes for a member; declare it "
                     "with a default on tf_tput.systems.System or Trainer, "
                     "tf_tput.runtime.Runtime or in tf_tput.micro.MEMBERS, and call it "
                     f"(docs/extending.md): {found}")


def test_every_micro_system_module_declares_the_whole_interface():
  for name in micro.SYSTEMS:
    module = micro.system_module(name)
    missing = [m for m in micro.MEMBERS if m not in vars(module)]
    assert not missing, f"tf_tput/micro's {name} module lacks {missing}"
