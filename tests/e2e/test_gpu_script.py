"""scripts/gpu.sh: the batch comes from the plan, the runs are the four the GPU table
needs, and TensorFlow's absence is said; --dry_run, on this machine's CPU. (The runs
themselves need an NVIDIA GPU: docs/measurement.md, "On a GPU".)"""

import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from tf_tput import plan

from cli_helpers import REPO, error_lines

SCRIPT = str(REPO / "scripts" / "gpu.sh")


def _run(*args, env=None):
  env = {**os.environ, "PYTHON": sys.executable, **(env or {})}
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True,
                        timeout=120, env=env, cwd=REPO)


def test_a_dry_run_plans_the_batch_and_names_the_four_runs_without_tensorflow(tmp_path):
  proc = _run("--dry_run", "--memory_gib=139", "--log_every=5",
              env={"PYTHON": _python_without(tmp_path, ("tensorflow",))})
  assert proc.returncode == 0, proc.stderr
  fitting, _ = plan.largest_fitting(
      ["t5_base"], ["ModelConfig.activation_dtype = 'bfloat16'",
                    "DataConfig.inputs_length = 128", "DataConfig.targets_length = 128"],
      83.4 * 2**30)  # 60% of 139 GiB, as the script rounds it
  batch = fitting.train.global_batch
  assert batch == 512  # the batch shown to fit on an H200 (docs/results/)
  assert f"global batch {batch}:" in proc.stderr and "83.4 GiB (60% of 139 GiB)" in proc.stderr
  assert "mtf, tf2: skipped: TensorFlow is not installed for" in proc.stderr
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


def _python_without(tmp_path, missing: tuple) -> str:
  """A fresh venv's Python that sees every package of this one's (jax, torch, numpy,
  pip) but `missing`: a GPU machine's Python, its CUDA builds aside."""
  venv, farm = tmp_path / "machine", tmp_path / "machine-site"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=60)
  farm.mkdir()
  ours = pathlib.Path(next(p for p in sys.path if p.endswith("site-packages")))
  for entry in ours.iterdir():
    if not entry.name.lower().startswith(missing):
      (farm / entry.name).symlink_to(entry)
  [site] = venv.glob("lib/python*/site-packages")
  (site / "machine.pth").write_text(f"{farm}\n")
  return str(venv / "bin" / "python")


MISSING = ("absl", "gin", "optax")  # setup.py's "gpu" extra, by module


def test_a_python_without_the_light_dependencies_installs_them_or_says_how_in_one_line(
    tmp_path):
  python = _python_without(tmp_path, MISSING)
  assert subprocess.run([python, "-c", "import absl"], capture_output=True).returncode
  env = {"PYTHON": python, "TF_TPUT_GPU_DEPS": str(tmp_path / "deps"),
         "TF_TPUT_WHEELHOUSE": str(tmp_path / "wheelhouse")}
  # No network and no wheelhouse: one line saying how to make one.
  (tmp_path / "wheelhouse").mkdir()
  proc = _run("--dry_run", "--memory_gib=80", env=env)
  assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.splitlines()[-1]]
  assert "lacks absl-py" in proc.stderr and "--build_wheelhouse" in proc.stderr
  assert "Traceback" not in proc.stderr
  (tmp_path / "wheelhouse").rmdir()
  built = _run("--build_wheelhouse", env=env)
  if built.returncode:
    pytest.skip(f"no wheelhouse without PyPI: {built.stderr.strip()[-300:]}")
  assert sorted(w.name.split("-")[0] for w in (tmp_path / "wheelhouse").iterdir()) == [
      "absl_py", "gin_config", "optax"]
  proc = _run("--dry_run", "--memory_gib=80", env=env)  # from the wheelhouse alone
  assert proc.returncode == 0, proc.stderr
  assert f"into {tmp_path / 'deps'} from {tmp_path / 'wheelhouse'}" in proc.stderr
  assert "global batch 256:" in proc.stderr and proc.stdout.count("would run:") >= 4
  installed = {p.name.split("-")[0] for p in (tmp_path / "deps").glob("*.dist-info")}
  assert installed == {"absl_py", "gin_config", "optax"}  # nothing else: no jax, no torch
  again = _run("--dry_run", "--memory_gib=80", env=env)
  assert again.returncode == 0 and "installing" not in again.stderr  # found, kept
