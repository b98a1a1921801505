"""tf_tput/request.py: tf_tput.train's flags are one table, read into one frozen Request
in main() and nowhere else; the record's `flags` and the bindings come from it."""

import ast
import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest
from absl import flags

from tf_tput import config, request

REPO = pathlib.Path(__file__).resolve().parents[2]


def _parsed(argv):
  values = flags.FlagValues()
  request.define_flags("tf_tput.train", values)
  values(["train", *argv])
  return values


def test_the_table_has_one_flag_per_request_field_in_order():
  assert [f.name for f in request.FLAGS_TABLE] == [
      field.name for field in dataclasses.fields(request.Request)]


def test_every_flag_that_overrides_a_binding_is_a_field_that_says_so():
  helps = {f.name: f.help for f in request.FLAGS_TABLE}
  for binding, flag in config.FLAG_OF.items():
    assert flag.startswith("--") and flag[2:] in helps, flag
    assert f"overrides {binding}" in helps[flag[2:]], (flag, helps[flag[2:]])


def test_parsed_flags_become_the_request_and_the_records_flags():
  values = _parsed(["--gin_file=t5_tiny", "--gin_file=data2", "--system=jax",
                    "--gin_param=A.b = 1", "--steps=3", "--global_batch=4",
                    "--strategy=multi_worker", "--nopacked", "--step_timeout_s=2.5"])
  made = request.from_flags(values)
  assert made == request.Request(
      gin_file=("t5_tiny", "data2"), gin_param=("A.b = 1",), system="jax", steps=3,
      global_batch=4, strategy="multi_worker", step_timeout_s=2.5)
  # The record's flags: every flag's value as absl holds it (a repeated one a list).
  assert made.as_flags() == {f.name: values[f.name].value for f in request.FLAGS_TABLE}
  with pytest.raises(dataclasses.FrozenInstanceError):
    made.steps = 4


def test_defaults_are_the_requests():
  values = _parsed([])
  assert request.from_flags(values) == request.Request()
  assert {name: values[name].default for name in request.FIELDS} == (
      request.Request().as_flags())


def test_bindings_are_gin_params_then_the_overriding_flags_in_order():
  made = request.Request(gin_param=("A.b = 1",), global_batch=4, steps=3)
  assert made.bindings() == ["A.b = 1", "TrainConfig.steps = 3",
                             "TrainConfig.global_batch = 4"]


def _flags_reads(path: pathlib.Path) -> list:
  """(function, line) of each read of a name FLAGS; function None at module level."""
  reads = []

  def visit(node, function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.Name) and child.id == "FLAGS" and isinstance(
          child.ctx, ast.Load):
        reads.append((function, child.lineno))
      functions = (ast.FunctionDef, ast.AsyncFunctionDef)
      visit(child, child.name if isinstance(child, functions) else function)
  visit(ast.parse(path.read_text()), None)
  return reads


def test_flags_are_read_only_in_an_entry_points_main():
  """tf_tput.train reads FLAGS only in main; no module below an entry point reads it."""
  package = REPO / "tf_tput"
  for path in sorted(package.rglob("*.py")):
    name = path.relative_to(package).as_posix()
    if name == "entry.py":  # every entry point's start
      continue
    allowed = {"main"} if "entry.start(" in path.read_text() else set()
    assert {function for function, _ in _flags_reads(path)} <= allowed, (
        name, _flags_reads(path))
  assert {function for function, _ in _flags_reads(package / "train.py")} == {"main"}


def test_the_read_check_finds_a_read_outside_main(tmp_path):
  source = tmp_path / "m.py"
  source.write_text("FLAGS = 1\ndef run():\n  return FLAGS.x\ndef main():\n  FLAGS\n")
  assert _flags_reads(source) == [("run", 3), ("main", 5)]


# Entry points that read their flags in main into one frozen request: a flag without a
# field would be ignored. Each is imported in a fresh interpreter: several define the
# same flag names, and absl refuses a second definition in one process.
REQUESTS = [("tf_tput.suite.__main__", "SuiteRequest"), ("tf_tput.launch", "LaunchRequest"),
            ("tf_tput.overhead", "OverheadRequest"), ("tf_tput.parity", "ParityRequest"),
            ("tf_tput.plan", "PlanRequest"), ("tf_tput.micro.__main__", "MicroRequest"),
            ("tf_tput.report.__main__", "ReportRequest")]
# Fields that are no flag's value: whether --results was given at all (--compare refuses it).
NOT_FLAGS = {"ReportRequest": {"results_given"}}
_FIELDS_SCRIPT = r"""
import dataclasses, importlib, json, sys
from absl import flags
module = importlib.import_module(sys.argv[1])
print(json.dumps({
    "flags": [f.name for f in flags.FLAGS.get_flags_for_module(module.__name__)],
    "fields": [f.name for f in dataclasses.fields(vars(module)[sys.argv[2]])]}))
"""


@pytest.mark.parametrize("module, request_class", REQUESTS)
def test_an_entry_points_request_has_a_field_for_each_of_its_flags(module, request_class):
  done = subprocess.run([sys.executable, "-c", _FIELDS_SCRIPT, module, request_class],
                        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  found = json.loads(done.stdout.strip().splitlines()[-1])
  assert set(found["flags"]) == set(found["fields"]) - NOT_FLAGS.get(request_class, set()), (
      found)
