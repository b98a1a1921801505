"""--system=pathways end to end, as far as it goes without a Pathways cluster: the real
proxy client (pathwaysutils, JAX's IFRT proxy backend) against a loopback port that
accepts connections and says nothing. The run must fail within --cluster_timeout_s,
in a failed record and one error line naming the address and what to fix."""

import importlib.util
import json
import socket

import pytest

from tf_tput.records import results
from tf_tput.systems.jax.pathways import runtime as pathways_runtime

from cli_helpers import error_lines, run_cli

TRAIN = ("tf_tput.train", "--system=pathways", "--gin_file=gin/models/t5_tiny.gin")
INSTALLED = importlib.util.find_spec("pathwaysutils") is not None


@pytest.fixture
def silent_proxy():
  """A loopback port whose connections the kernel accepts and nobody answers."""
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"grpc://127.0.0.1:{listener.getsockname()[1]}"


@pytest.mark.skipif(not INSTALLED, reason="the pathways extra (pathwaysutils) is not "
                    "installed; the missing-package line is tested below instead")
def test_a_silent_proxy_fails_the_run_within_the_timeout_in_one_line(
    tmp_path, monkeypatch, silent_proxy, no_leftover_processes):
  monkeypatch.setenv("JAX_BACKEND_TARGET", silent_proxy)
  monkeypatch.delenv(pathways_runtime.CONNECTION_TIMEOUT_ENV, raising=False)
  out = tmp_path / "runs.jsonl"
  # The proxy client would wait far longer than the flag by itself.
  proc = run_cli(*TRAIN, "--cluster_timeout_s=2", f"--results={out}", timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]  # failed, not aborted at exit
  expected = (f"no Pathways proxy answered at {silent_proxy} (JAX_BACKEND_TARGET) within "
              "--cluster_timeout_s=2")
  assert error_lines(proc.stderr) == [
      f"error: run failed: devices: TimeoutError: {expected}; start the Pathways cluster "
      "and its proxy and point JAX_BACKEND_TARGET at it (docs/systems.md), or "
      "raise --cluster_timeout_s"]
  [line] = out.read_text().splitlines()
  record = json.loads(line)
  results.validate(record)
  assert record["status"] == "failed" and expected in record["error"]
  assert record["system"] == "pathways" and record["num_processes"] == 1
  assert record["env"]["pathwaysutils"] and record["env"]["jax"]
  assert "never run against a Pathways cluster" in proc.stderr  # the log says so


def test_without_the_proxy_address_or_the_extra_nothing_starts(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_BACKEND_TARGET", raising=False)
  out = tmp_path / "runs.jsonl"
  proc = run_cli(*TRAIN, f"--results={out}", timeout=120)
  assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
  assert proc.stderr.startswith(
      "error: --system=pathways: JAX_BACKEND_TARGET is not set; point it at" if INSTALLED
      else 'error: --system=pathways needs pathwaysutils, not installed; install the '
      'extra: pip install -e ".[pathways]"')
  assert not out.exists()
