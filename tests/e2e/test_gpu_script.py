"""scripts/gpu.sh: the batch comes from the plan, the runs are the four the GPU table
needs, and TensorFlow's absence is said; --dry_run, on this machine's CPU. (The runs
themselves need an NVIDIA GPU: docs/measurement.md, "On a GPU".)"""

import os
import shlex
import subprocess
import sys

from tf_tput import plan

from cli_helpers import REPO, error_lines

SCRIPT = str(REPO / "scripts" / "gpu.sh")


def _run(*args, env=None):
  env = dict(os.environ, PYTHON=sys.executable, **(env or {}))
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True,
                        timeout=120, env=env, cwd=REPO)


def test_a_dry_run_plans_the_batch_and_names_the_four_runs_without_tensorflow(tmp_path):
  # A `tensorflow` that fails to import, first on the path: a machine without it.
  fake = tmp_path / "tensorflow"
  fake.mkdir()
  (fake / "__init__.py").write_text("raise ImportError('simulated: no TensorFlow')\n")
  proc = _run("--dry_run", "--memory_gib=139", "--log_every=5",
              env={"PYTHONPATH": str(tmp_path)})
  assert proc.returncode == 0, proc.stderr
  fitting, _ = plan.largest_fitting(
      ["t5_base"], ["ModelConfig.activation_dtype = 'bfloat16'",
                    "DataConfig.inputs_length = 128", "DataConfig.targets_length = 128"],
      83.4 * 2**30)  # 60% of 139 GiB, as the script rounds it
  batch = fitting.train.global_batch
  assert batch == 512  # the batch shown to fit on an H200 (docs/results/)
  assert f"global batch {batch}:" in proc.stderr and "83.4 GiB (60% of 139 GiB)" in proc.stderr
  assert "mtf, tf2: skipped: TensorFlow is not installed" in proc.stderr
  runs = [shlex.split(line[len("would run: "):]) for line in proc.stdout.splitlines()
          if line.startswith("would run: ")]
  described = [(a[a.index("-m") + 2], [p for p in a if "embedding" in p or "compile" in p])
               for a in runs]
  assert described == [
      ("--system=jax", ["--gin_param=ModelConfig.embedding = 'gather'"]),
      ("--system=jax", ["--gin_param=ModelConfig.embedding = 'one_hot'"]),
      ("--system=torch", ["--gin_param=ModelConfig.embedding = 'gather'",
                          "--gin_param=TorchOptions.compile = False"]),
      ("--system=torch", ["--gin_param=ModelConfig.embedding = 'gather'",
                          "--gin_param=TorchOptions.compile = True"])]
  for argv in runs:
    assert f"--global_batch={batch}" in argv and argv[-1] == "--log_every=5"
    assert "--gin_param=ModelConfig.activation_dtype = 'bfloat16'" in argv


def test_without_a_gpu_or_with_a_bad_memory_it_says_so_in_one_line(tmp_path):
  # An nvidia-smi that lists no GPU, first on the path: no GPU, even on a machine with one.
  (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
  (tmp_path / "nvidia-smi").chmod(0o755)
  for args, message in (((), "no NVIDIA GPU found"),
                        (("--dry_run", "--memory_gib=abc"), "--memory_gib=abc")):
    proc = _run(*args, env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
    assert message in proc.stderr
