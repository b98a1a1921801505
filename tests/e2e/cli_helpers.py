"""End-to-end test helpers: run tf_tput entry points as a user would, in a subprocess."""

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_cli(module: str, *args: str, cwd=REPO, timeout: float = 600):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list:
  return [line for line in stderr.splitlines() if line.startswith("error:")]


class Launched:
  """An entry point (tf_tput.launch unless named) in the background, its stderr
  collected line by line."""

  def __init__(self, args, module: str = "tf_tput.launch", env=None):
    env = env or dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    self.proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO,
                                 env=env, stderr=subprocess.PIPE, text=True)
    self.lines = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append(line)

  def wait_for(self, text: str, timeout: float = 240):
    """Returns once a stderr line holds text; otherwise stops the launcher (its
    children go with it) and fails, so a failing test leaves no process running."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in self.lines):
      problem = ("the launcher ended" if self.proc.poll() is not None else
                 f"no {text!r} within {timeout:g} s" if time.monotonic() >= deadline
                 else None)
      if problem:
        self.finish(timeout=0)
        raise AssertionError(f"{problem}: {''.join(self.lines)[-3000:]}")
      time.sleep(0.1)

  def worker(self, index: int):
    """The launcher's child that TF_CONFIG names worker `index`."""
    import psutil
    for p in psutil.Process(self.proc.pid).children(recursive=True):
      task = json.loads(p.environ().get("TF_CONFIG", "{}")).get("task", {})
      if task == {"type": "worker", "index": index}:
        return p
    raise AssertionError(f"no worker {index} among the launcher's children")

  def finish(self, timeout: float) -> str:
    try:
      if timeout:
        self.proc.wait(timeout=timeout)
    finally:
      if self.proc.poll() is None:
        self.proc.kill()
        self.proc.wait()
    self._reader.join(5)
    return "".join(self.lines)
