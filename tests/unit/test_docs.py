"""Docs that tests keep true: each test compares a page with the code it describes,
without starting a framework.

  docs/records.md  its two field tables list exactly results.FIELDS and MICRO_FIELDS
  docs/flags.md    is the text generated from every entry point's absl flags;
                   regenerate it with
                       .venv/bin/python tests/unit/test_docs.py --write-flags
  docs/systems.md  a section per registered system (tf_tput.systems), and README.md's
                   support matrix a row per registered system
  docs/models.md   every model file with its parameter count, every mesh and
                   pipeline file
  docs/suites.md   "Comparing two result files" gives --compare's runs a side and
                   the odds of a false claim at that count
  links            relative links in README.md and docs/**/*.md point at files (and
                   headings) that exist

The commands README.md shows are run by tests/e2e/test_readme_commands.py.
"""

import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = REPO / "README.md"
FLAGS_DOC = DOCS / "flags.md"
REGENERATE = ".venv/bin/python tests/unit/test_docs.py --write-flags"

# `python -m NAME` -> the module that defines its flags.
ENTRY_POINTS = {
    "tf_tput.train": "tf_tput.train",
    "tf_tput.launch": "tf_tput.launch",
    "tf_tput.suite": "tf_tput.suite.__main__",
    "tf_tput.report": "tf_tput.report.__main__",
    "tf_tput.plan": "tf_tput.plan",
    "tf_tput.parity": "tf_tput.parity",
    "tf_tput.overhead": "tf_tput.overhead",
    "tf_tput.micro": "tf_tput.micro.__main__",
}
# Modules with flags that users do not run: processes the entry points start,
# entry.py, whose flags every entry point has (listed under each), and request.py,
# which defines tf_tput.train's as that module's own.
INTERNAL_FLAG_MODULES = {"tf_tput.micro.jax_host", "tf_tput.entry", "tf_tput.request"}


# --- markdown helpers ---------------------------------------------------------------

def _read(path: pathlib.Path) -> str:
  return path.read_text(encoding="utf-8")


def _without_code(text: str) -> str:
  """The text without fenced code blocks (their lines become empty)."""
  out, fenced = [], False
  for line in text.splitlines():
    if line.lstrip().startswith("```"):
      fenced = not fenced
      out.append("")
      continue
    out.append("" if fenced else line)
  return "\n".join(out)


def _cells(line: str) -> list:
  parts = re.split(r"(?<!\\)\|", line.strip())
  return [p.strip() for p in parts[1:-1]]


def _sections(text: str, level: int = 2) -> dict:
  """heading text -> the lines under it, up to the next heading of `level` or above."""
  sections, current = {}, None
  for line in _without_code(text).splitlines():
    match = re.match(r"^(#+)\s+(.*)$", line)
    if match and len(match.group(1)) <= level:
      current = match.group(2).strip() if len(match.group(1)) == level else None
      if current is not None:
        sections[current] = []
      continue
    if current is not None:
      sections[current].append(line)
  return sections


def _tables(lines: list) -> list:
  """[(header cells, [row cells, ...])] of the markdown tables in `lines`."""
  tables, i = [], 0
  while i < len(lines):
    if (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
        and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1])):
      header, rows, i = _cells(lines[i]), [], i + 2
      while i < len(lines) and lines[i].lstrip().startswith("|"):
        rows.append(_cells(lines[i]))
        i += 1
      tables.append((header, rows))
    else:
      i += 1
  return tables


def _first_column_names(lines: list) -> list:
  """The backticked names in the first column of every table in `lines`."""
  names = []
  for _, rows in _tables(lines):
    for row in rows:
      match = re.fullmatch(r"`([^`]+)`", row[0]) if row else None
      if match:
        names.append(match.group(1))
  return names


def _section(path: pathlib.Path, heading_start: str, level: int = 2) -> list:
  found = [lines for heading, lines in _sections(_read(path), level).items()
           if heading.startswith(heading_start)]
  assert len(found) == 1, (f"{path.relative_to(REPO)} needs one section headed "
                           f"'{'#' * level} {heading_start}...'")
  return found[0]


# --- records ------------------------------------------------------------------------

def _assert_same(documented: list, actual, where: str) -> None:
  duplicated = sorted({n for n in documented if documented.count(n) > 1})
  missing = [n for n in actual if n not in documented]
  extra = [n for n in documented if n not in actual]
  assert not (missing or extra or duplicated), (
      f"{where}: missing {missing}, not in the code {extra}, listed twice {duplicated}")


def test_records_doc_lists_exactly_the_schema_fields():
  from tf_tput.records import results
  records = DOCS / "records.md"
  _assert_same(_first_column_names(_section(records, "Training records")),
               list(results.FIELDS), "docs/records.md, Training records vs results.FIELDS")
  _assert_same(_first_column_names(_section(records, "Micro-benchmark records")),
               list(results.MICRO_FIELDS),
               "docs/records.md, Micro-benchmark records vs results.MICRO_FIELDS")


# --- flags --------------------------------------------------------------------------

# Run in a fresh interpreter per entry point: several define the same flag names, and
# absl refuses a second definition in one process.
_FLAGS_SCRIPT = r"""
import importlib, json, sys
from absl import flags
importlib.import_module(sys.argv[1])
TYPES = {"string": "string", "integer": "int", "float": "float", "bool": "bool",
         "string enum": "enum", "multi string": "repeatable", "multi int": "repeatable int",
         "comma separated list of strings": "list"}
def default(d):
  if d is None or d == []:
    return "-"
  if isinstance(d, bool):
    return "`" + str(d).lower() + "`"
  if isinstance(d, (list, tuple)):
    return "`" + ",".join(str(v) for v in d) + "`"
  return "`" + str(d) + "`"
out = []
for module, defined in flags.FLAGS.flags_by_module_dict().items():
  if module.startswith("tf_tput"):
    out += [{"name": f.name, "type": TYPES.get(f.flag_type(), f.flag_type()),
             "default": default(f.default), "help": " ".join(f.help.split())}
            for f in defined]
print(json.dumps({"doc": (sys.modules[sys.argv[1]].__doc__ or "").strip().splitlines()[0],
                  "flags": sorted(out, key=lambda f: f["name"])}))
"""


def _flags_of(module: str) -> dict:
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  done = subprocess.run([sys.executable, "-c", _FLAGS_SCRIPT, module], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, f"importing {module} failed:\n{done.stderr[-3000:]}"
  return json.loads(done.stdout.strip().splitlines()[-1])


def flags_markdown() -> str:
  """docs/flags.md as the code defines it."""
  with concurrent.futures.ThreadPoolExecutor(len(ENTRY_POINTS)) as pool:
    found = dict(zip(ENTRY_POINTS, pool.map(_flags_of, ENTRY_POINTS.values()), strict=True))
  lines = ["# Flags of every entry point", "",
           "Generated from the code by `tests/unit/test_docs.py`, which fails when this "
           "file and the code differ. Do not edit it by hand; regenerate it with", "",
           f"    {REGENERATE}", "",
           "Every entry point also takes absl's own flags (`--helpfull` lists them). "
           "Repeatable flags are given once per value; list flags take comma-separated "
           "values.", ""]
  for name, info in found.items():
    lines += [f"## {name}", "", f"`python -m {name}`: {info['doc']}", "",
              "| flag | type | default | meaning |", "|---|---|---|---|"]
    for f in info["flags"]:
      # The type column says "repeatable"; "<" would open an HTML tag on GitHub.
      meaning = (f["help"].replace("; repeat this option to specify a list of values", "")
                 .replace("|", "\\|").replace("<", "&lt;"))
      lines.append(f"| `--{f['name']}` | {f['type']} | {f['default']} | {meaning} |")
    lines.append("")
  return "\n".join(lines)


def _flag_modules_in_source() -> set:
  found = set()
  for path in (REPO / "tf_tput").rglob("*.py"):
    if re.search(r"\bflags\.DEFINE_", _read(path)):
      module = ".".join(path.relative_to(REPO).with_suffix("").parts)
      found.add(module)
  return found


def test_every_module_with_flags_is_a_documented_entry_point():
  unknown = _flag_modules_in_source() - set(ENTRY_POINTS.values()) - INTERNAL_FLAG_MODULES
  assert not unknown, (f"{sorted(unknown)} define flags: add them to ENTRY_POINTS in "
                       f"tests/unit/test_docs.py (or INTERNAL_FLAG_MODULES), then run "
                       f"{REGENERATE}")


def test_flags_doc_matches_the_code():
  expected = flags_markdown()
  actual = _read(FLAGS_DOC) if FLAGS_DOC.exists() else ""
  assert actual == expected, (f"docs/flags.md differs from the entry points' flags; "
                              f"regenerate it: {REGENERATE}")


# --- systems ------------------------------------------------------------------------

def _shipped_systems() -> list:
  """The systems tf_tput ships: REGISTRY less plugins that installed distributions
  add (systems.BUILT_IN where it exists), which these docs do not describe."""
  from tf_tput import systems
  return list(getattr(systems, "BUILT_IN", systems.REGISTRY))


def test_systems_doc_has_a_section_per_registered_system():
  headings = [m.group(1) for m in re.finditer(r"^## `(\w+)`", _without_code(
      _read(DOCS / "systems.md")), re.MULTILINE)]
  _assert_same(headings, _shipped_systems(),
               "docs/systems.md '## `name`' sections vs the registered systems")


def test_readme_support_matrix_has_a_row_per_registered_system():
  _assert_same(_first_column_names(_section(README, "Support matrix")),
               _shipped_systems(), "README.md support matrix vs the registered systems")


# --- models -------------------------------------------------------------------------

def _gin_files(folder: str) -> dict:
  import tf_tput
  return {p.stem: p for p in sorted((tf_tput.GIN_DIR / folder).glob("*.gin"))
          if not p.name.endswith("_common.gin")}


def test_models_doc_lists_every_model_file_with_its_parameter_count():
  from tf_tput import config, models
  lines = _section(DOCS / "models.md", "Model files")
  documented = {}
  for header, rows in _tables(lines):
    assert "parameters" in header, "docs/models.md, Model files: a 'parameters' column"
    column = header.index("parameters")
    for row in rows:
      name = re.fullmatch(r"`([^`]+)`", row[0])
      assert name, f"docs/models.md: first column of {row} is not a `file name`"
      documented[name.group(1)] = row[column]
  files = _gin_files("models")
  _assert_same(list(documented), list(files), "docs/models.md, Model files vs gin/models")
  wrong = {}
  for name, path in files.items():
    count = models.num_params(config.load_experiment([str(path)]).model)
    if documented[name].replace(",", "") != str(count):
      wrong[name] = f"{documented[name]} documented, {count:,} computed"
  assert not wrong, f"docs/models.md parameter counts: {wrong}"


def test_models_doc_lists_every_mesh_and_pipeline_file():
  for heading, folder in (("Mesh files", "mesh"), ("Pipeline files", "pipeline")):
    _assert_same(_first_column_names(_section(DOCS / "models.md", heading)),
                 list(_gin_files(folder)), f"docs/models.md, {heading} vs gin/{folder}")


# --- suites -------------------------------------------------------------------------

def test_suites_doc_gives_the_runs_a_comparison_needs():
  from tf_tput.report import compare
  text = " ".join(" ".join(_section(DOCS / "suites.md", "Comparing two result files")).split())
  for claim in (f"at least **{compare.MIN_RUNS} runs a side**",
                f"with {compare.MIN_RUNS} a side 1 in {compare.false_claim_odds()}",
                f"a claim needs {compare.MIN_RUNS} a side"):
    assert claim in text, f"docs/suites.md, Comparing two result files: no '{claim}'"


# --- links --------------------------------------------------------------------------

def _markdown_files() -> list:
  return [README] + sorted(DOCS.rglob("*.md"))


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading."""
  text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: pathlib.Path) -> set:
  return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$",
                                                 _without_code(_read(path)), re.MULTILINE)}


def test_relative_links_point_at_files_and_headings_that_exist():
  broken = []
  for path in _markdown_files():
    text = re.sub(r"`[^`\n]*`", "", _without_code(_read(path)))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"^[a-z][a-z0-9+.-]*:", target):
        continue  # http:, https:, mailto:
      file_part, _, anchor = target.partition("#")
      linked = (path.parent / file_part).resolve() if file_part else path
      where = f"{path.relative_to(REPO)} -> {target}"
      if not linked.exists():
        broken.append(f"{where}: no such file")
      elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
        broken.append(f"{where}: no such heading")
  assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_follows_github():
  assert _slug("`mtf`: the TF baseline (Mesh TensorFlow)") == "mtf-the-tf-baseline-mesh-tensorflow"
  assert _slug("tf_tput.launch") == "tf_tputlaunch"
  assert _slug("The clock and `sync_every`") == "the-clock-and-sync_every"


if __name__ == "__main__":
  if sys.argv[1:] == ["--write-flags"]:
    FLAGS_DOC.write_text(flags_markdown(), encoding="utf-8")
    print(f"wrote {FLAGS_DOC.relative_to(REPO)}")
  else:
    sys.exit(f"usage: {REGENERATE}")


def test_entry_points_usage_keeps_its_examples_line_continuations():
  """absl prints an entry point's docstring as its --help: a `\\` at a line's end
  in a plain string literal joins the lines, so a docstring with one must be raw."""
  for module in ENTRY_POINTS.values():
    path = REPO / (module.replace(".", "/") + ".py")
    source = _read(path)
    start = re.search(r'^(r?)"""', source, re.M)
    docstring = source[start.end():source.index('"""', start.end())]
    if "\\\n" in docstring:
      assert start.group(1) == "r", f"{path}: make its docstring raw (r\"\"\"...)"
