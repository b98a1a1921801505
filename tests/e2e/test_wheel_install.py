"""A wheel of the project in a fresh virtualenv, run from a directory outside the
source tree: setup.py ships the checkout's gin/ inside the package (tf_tput/gin/),
named by file name (--gin_file=t5_tiny, --suite=table1_local) or as
gin/models/t5_tiny.gin.

The new venv gets the wheel alone (--no-deps); the dependencies come from this
interpreter's site-packages, named by a path line in a .pth file. Python adds such a
path to sys.path but does not process the .pth files inside it, so the editable
install's finder (which maps tf_tput to the source tree) stays off: tf_tput is the
wheel's copy.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

from tf_tput.records import results

from cli_helpers import error_lines

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN_TINY = ["--system=jax", "--gin_file=t5_tiny", "--gin_file=gin/mesh/single.gin",
              "--steps=2", "--warmup_steps=1",
              "--global_batch=2", "--gin_param=DataConfig.inputs_length=16",
              "--gin_param=DataConfig.targets_length=16"]


def _env() -> dict:
  """This environment without a PYTHONPATH (no source tree on sys.path)."""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  return dict(env, TF_CPP_MIN_LOG_LEVEL="2")


def _run(command, cwd, timeout=300) -> subprocess.CompletedProcess:
  proc = subprocess.run([str(c) for c in command], cwd=cwd, env=_env(),
                        capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, f"{command}: {proc.stdout[-2000:]}{proc.stderr[-3000:]}"
  return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """(python of a fresh venv holding the wheel, an empty working directory)."""
  tmp = tmp_path_factory.mktemp("wheel")
  # Built from a copy: setuptools writes build/ and tf_tput.egg-info/ beside setup.py,
  # which must not appear in (or go stale in) the source tree.
  src = tmp / "src"
  for folder in ("tf_tput", "gin"):
    shutil.copytree(REPO / folder, src / folder,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  shutil.copy2(REPO / "setup.py", src / "setup.py")
  _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation",
        "--no-index", "-q", "-w", tmp / "dist"], cwd=src)
  wheel, = (tmp / "dist").glob("tf_tput-*.whl")

  venv = tmp / "venv"
  _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
  python = venv / "bin" / "python"
  _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
        "--no-index", "-q", wheel], cwd=tmp)
  site_packages = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                        "['purelib'])"], cwd=tmp).stdout.strip()
  # This interpreter's (.venv's) site-packages: the dependencies, not tf_tput.
  deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
  (pathlib.Path(site_packages) / "tf_tput_test_deps.pth").write_text(
      "".join(f"{path}\n" for path in deps))
  workdir = tmp / "work"
  workdir.mkdir()
  return python, workdir


def test_the_package_and_its_gin_files_come_from_the_wheel(installed):
  python, workdir = installed
  proc = _run([python, "-c", "import json, tf_tput; from tf_tput import config; "
               "from tf_tput.records import keys, provenance; print(json.dumps(["
               "tf_tput.__file__, str(config.resolve_gin_file('t5_tiny')), "
               "str(config.resolve_gin_file('gin/models/t5_tiny.gin')), "
               "provenance.git_commit(), keys.code_version()]))"], cwd=workdir)
  package_file, bare, by_path, commit, code = json.loads(proc.stdout)
  venv = python.parent.parent
  assert pathlib.Path(package_file).is_relative_to(venv), package_file
  assert bare == by_path and pathlib.Path(bare).is_relative_to(venv), bare
  assert pathlib.Path(bare).parent.parent == pathlib.Path(package_file).parent / "gin"
  assert commit is None and code is None  # an installed package is no git checkout


def test_train_suite_and_report_run_outside_the_source_tree(installed,
                                                           no_leftover_processes):
  python, workdir = installed
  train = _run([python, "-m", "tf_tput.train", *TRAIN_TINY, "--results=out.jsonl"],
               cwd=workdir)
  assert not error_lines(train.stderr) and "Path not found" not in train.stderr
  lines = (workdir / "out.jsonl").read_text().splitlines()
  assert len(lines) == 1
  record = json.loads(lines[0])
  results.validate(record)
  assert record["status"] == "ok" and record["system"] == "jax"
  assert record["tokens_per_step"] == 2 * (16 + 16) and record["git_commit"] is None

  suite = _run([python, "-m", "tf_tput.suite", "--suite=table1_local", "--dry_run"],
               cwd=workdir)
  assert "run(s) valid; nothing was run" in suite.stdout, suite.stdout

  _run([python, "-m", "tf_tput.report", "--results=out.jsonl", "--out=report"],
       cwd=workdir)
  assert "t5_tiny" in (workdir / "report" / "report.md").read_text()
  assert sorted(p.name for p in workdir.iterdir()) == ["out.jsonl", "report"]
