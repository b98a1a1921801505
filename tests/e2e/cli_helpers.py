"""End-to-end test helpers: run tf_tput entry points as a user would, in a subprocess."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_cli(module: str, *args: str, cwd=REPO, timeout: float = 600):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list:
  return [line for line in stderr.splitlines() if line.startswith("error:")]

