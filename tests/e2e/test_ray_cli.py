"""--system=ray through tf_tput.train: a driver and 2 Ray actors in a
private loopback cluster, each actor a torch trainer for its rows.

Each run starts a Ray cluster (5-10 s on two cores); after every test no process it
started is left running (the fixture), whether the run ended, failed or was stopped.
"""

import importlib.util
import os
import re
import signal
import time

import psutil
import pytest

from tf_tput.records import results

from cli_helpers import Launched, error_lines, run_cli

pytestmark = [pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                                     for m in ("ray", "torch")),
                                 reason="the ray extra (ray, torch) is not installed"),
              pytest.mark.loopback_ports,  # Ray's own ports (tests/conftest.py)
              pytest.mark.usefixtures("no_leftover_processes")]

# decoder_tiny at 16 positions: the quickest steps of 2 actors.
TWO_ACTORS = ["--system=ray", "--num_cpu_devices=2", "--gin_file=decoder_tiny",
              "--gin_param=DataConfig.targets_length=16",
              "--gin_param=MeshConfig.mesh_shape='batch:2'", "--warmup_steps=1"]


def _actor_pid(launched: Launched, rank: int) -> int:
  for line in launched.lines:
    found = re.search(rf"ray actor {rank}: pid (\d+)", line)
    if found:
      return int(found.group(1))
  raise AssertionError(f"no pid logged for actor {rank}")


def test_a_killed_actor_fails_the_run_naming_it_within_30_s(tmp_path):
  out = tmp_path / "runs.jsonl"
  launched = Launched([*TWO_ACTORS, "--steps=100000", "--log_every=1",
                       f"--results={out}"], module="tf_tput.train")
  launched.wait_for("step 2/")
  pid = _actor_pid(launched, 1)
  signal_sent = time.monotonic()
  os.kill(pid, signal.SIGKILL)
  stderr = launched.finish(timeout=60)
  assert time.monotonic() - signal_sent < 30, stderr[-4000:]
  assert launched.proc.returncode == 1, stderr[-3000:]
  [error] = [line for line in error_lines(stderr) if "run failed" in line]
  assert f"ray actor 1 (pid {pid}, node " in error and ") died" in error, error
  [record] = results.read(str(out))[0]
  assert record["status"] == "failed" and f"ray actor 1 (pid {pid}, " in record["error"]
  assert "then" not in record["error"]  # one failure, nothing after it
  assert len(record["losses"]) >= 3  # the warmup step and at least 2 measured ones
  # What the run was, as any ray record says it (an ok one: test_islands_cli.py's).
  assert record["system"] == "ray" and record["strategy"] == "local"
  assert record["num_devices"] == 2 and record["num_processes"] == 1
  assert record["num_nodes"] == 1 and record["mesh_shape"] == "batch:2"
  assert record["env"]["accelerators"] == [
      {"platform": "cpu", "kind": record["env"]["accelerators"][0]["kind"], "count": 2}]
  assert record["peak_source"].startswith("measured: ray ")
  assert _actor_pid(launched, 0) not in (pid, None)  # two actors, two processes


def test_ctrl_c_stops_every_actor_and_the_driver_records_what_it_measured(tmp_path):
  out = tmp_path / "runs.jsonl"
  launched = Launched([*TWO_ACTORS, "--steps=100000", "--log_every=1",
                       f"--results={out}"], module="tf_tput.train")
  launched.wait_for("step 2/")
  actors = [_actor_pid(launched, rank) for rank in (0, 1)]
  launched.proc.send_signal(signal.SIGINT)
  stderr = launched.finish(timeout=60)
  assert launched.proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
  [record] = results.read(str(out))[0]
  assert (record["status"], record["signal"]) == ("interrupted", "SIGINT")
  assert record["steps_measured"] >= 2
  assert not [pid for pid in actors if psutil.pid_exists(pid)
              and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
  # the fixture then checks every other process the run started (raylet, GCS, workers)


def test_a_model_axis_is_refused_naming_the_systems_that_have_one():
  proc = run_cli("tf_tput.train", "--system=ray", "--num_cpu_devices=2",
                 "--gin_file=decoder_tiny", "--gin_param=MeshConfig.mesh_shape='batch:1;model:2'",
                 timeout=120)
  assert proc.returncode == 2
  [error] = error_lines(proc.stderr)
  assert "--system=ray is data parallel only" in error
  assert "--system=mtf or --system=jax" in error
