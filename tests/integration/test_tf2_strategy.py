"""--system=tf2 under MirroredStrategy: two replicas on two virtual CPUs train what mtf
and jax train on the same mesh (and torch on one device, in the same parity run), and
a model axis is refused in one line before TF starts. (On one device tf2 and jax each train what mtf trains, in-process:
tests/unit/test_tf2_model.py and tests/unit/test_jax_model.py.)

Virtual CPU devices can be configured once per process, so each case is a subprocess.
"""

import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(module: str, *args: str, timeout: float = 300):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


def _parity(*args: str) -> str:
  # A decoder: the replicas are what is checked here, and an encoder-decoder's graphs
  # cost each system twice the CPU to build; T5 on several devices is
  # tests/e2e/test_jax_cli.py's parity (mtf and jax on a 2x2 mesh).
  done = _run("tf_tput.parity", "--gin_file=gin/models/decoder_tiny.gin", *args)
  print(done.stdout)
  assert done.returncode == 0, done.stdout + done.stderr[-2000:]
  assert "parity: all 10 steps" in done.stdout
  return done.stdout


def test_two_replicas_and_torch_match_mtf_and_jax_on_the_same_mesh():
  """torch too, on one device (one per process), in the same run: one TF start and
  one mtf build for both comparisons with the TF baseline."""
  out = _parity("--mesh=batch:2", "--systems=mtf,tf2,jax,torch")
  assert "mesh batch:2" in out
  rows = [line.split() for line in out.splitlines() if re.match(r"\s*\d+\s", line)]
  assert len(rows) == 10 and all(len(row) == 1 + 4 + 3 for row in rows)
  torch_rel = [float(row[7]) for row in rows]  # step, 4 losses, rel tf2, jax, torch
  assert torch_rel[0] < 1e-5 and max(torch_rel) < 1e-3


def test_model_axis_is_one_line_error_before_tf_starts(tmp_path):
  done = _run("tf_tput.train", "--system=tf2", "--gin_file=gin/models/t5_tiny.gin",
              "--gin_file=gin/mesh/data2_model2.gin", "--num_cpu_devices=4",
              f"--results={tmp_path}/runs.jsonl", timeout=60)
  errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert done.returncode == 2, done.stderr[-2000:]
  assert len(errors) == 1 and "model:2" in errors[0]
  assert "--system=mtf or --system=jax" in errors[0]
  assert "tensorflow" not in done.stderr.lower().replace("tf.distribute", "")
  assert not (tmp_path / "runs.jsonl").exists()
