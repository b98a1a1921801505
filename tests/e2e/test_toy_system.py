"""A system added from outside tf_tput: one module (toy_system.py, beside this file) and
one entry point, no file of tf_tput touched, trained by train, run by a suite and
reported (docs/extending.md, "A new system")."""

import os
import pathlib
import shutil
import subprocess
import sys

from tf_tput.records import results

from cli_helpers import REPO

HERE = pathlib.Path(__file__).resolve().parent
# What the plugin consists of: its module, and the entry point that registers it.
PLUGIN_FILES = ["toy_system.py"]
ENTRY_POINT = "[tf_tput.systems]\ntoy = toy_system\n"


def _install_plugin(site: pathlib.Path) -> None:
  """A distribution on sys.path as pip would leave it: the module and a dist-info
  whose entry_points.txt registers the system."""
  for name in PLUGIN_FILES:
    shutil.copy(HERE / name, site / name)
  info = site / "toy_system-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-system\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text(ENTRY_POINT)


def _run(module: str, *args: str, env: dict, cwd) -> subprocess.CompletedProcess:
  proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc


def test_a_plugin_system_trains_runs_in_a_suite_and_is_reported(tmp_path):
  site = tmp_path / "site"
  site.mkdir()
  _install_plugin(site)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(site)]))
  out = tmp_path / "runs.jsonl"

  train = _run("tf_tput.train", "--system=toy", "--gin_file=decoder_tiny", "--steps=3",
               "--warmup_steps=1", f"--results={out}", env=env, cwd=tmp_path)
  assert "on toy:" in train.stdout
  suite = tmp_path / "toy.gin"
  suite.write_text("Suite.name = 'toy'\nSuite.matrices = [@TrainMatrix()]\n"
                   "TrainMatrix.models = ['t5_tiny', 'decoder_tiny']\n"
                   "TrainMatrix.systems = ['toy']\nTrainMatrix.num_cpu_devices = 1\n"
                   "TrainMatrix.steps = 2\nTrainMatrix.warmup_steps = 1\n")
  _run("tf_tput.suite", f"--suite={suite}", f"--results={out}", env=env, cwd=tmp_path)
  report = _run("tf_tput.report", f"--results={out}", f"--out={tmp_path / 'report'}",
                env=env, cwd=tmp_path)

  records, problems = results.read(str(out))
  assert problems == []
  assert [(r["system"], r["model"], r["status"]) for r in records] == [
      ("toy", "decoder_tiny", "ok"), ("toy", "t5_tiny", "ok"), ("toy", "decoder_tiny", "ok")]
  for r in records:
    assert r["tokens_per_sec"] > 0 and r["losses"][-1] < r["losses"][0]  # it learns
    assert r["peak_source"].startswith("measured: numpy") and r["env"]["numpy"]
  table1 = (tmp_path / "report" / "report.md").read_text()
  assert "| toy |" in table1, table1[:3000]
  assert "report.md" in report.stdout
  # Parity needs the optional export_variables and load_variables, which the toy
  # trainer leaves to their defaults: one line, not a traceback.
  parity = subprocess.run([sys.executable, "-m", "tf_tput.parity", "--systems=toy,jax",
                           "--gin_file=gin/models/decoder_tiny.gin", "--steps=1"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert parity.returncode == 2, parity.stderr[-2000:]
  assert [line for line in parity.stderr.splitlines() if line.startswith("error:")] == [
      "error: --systems: UnigramTrainer has no export_variables, which parity needs to "
      "start every trainer from the same weights; implement export_variables and "
      "load_variables (docs/extending.md)"], parity.stderr[-2000:]
  assert "Traceback" not in parity.stderr
