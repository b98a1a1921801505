"""A TF multi-worker cluster on loopback: a run, a killed worker, bad clusters, Ctrl-C.

tf_tput.launch --num_workers starts tf.distribute.Server workers and runs
tf_tput.train --strategy=multi_worker as their chief. After every test, no process
it started is left running (tests/conftest.py).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tf_tput.records import provenance, results
from tf_tput.runtime import namespaces, processes

from cli_helpers import REPO, Launched, error_lines, run_cli

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

# One layer: the cluster's plumbing is under test, and the chief builds the graph of
# every launch here (a second layer adds ~2 s to each).
TRAIN = ["--", sys.executable, "-m", "tf_tput.train", "--system=mtf",
         "--strategy=multi_worker", "--gin_file=gin/models/decoder_tiny.gin",
         "--gin_param=TrainConfig.global_batch = 4",
         "--gin_param=ModelConfig.num_layers = 1", "--warmup_steps=1"]
# Without root (or iproute2) no private network namespace can be made: the servers then
# listen on every interface, as --expose_servers says (test_no_exposed_servers.py).
EXPOSE = [] if namespaces.private_missing() is None else ["--expose_servers"]
LAUNCH_2X2 = ["--num_workers=2", "--devices_per_worker=2", "--grace_s=2", *EXPOSE]
MESH_2X2 = "--gin_file=gin/mesh/data2_model2.gin"


def _one_error_line(proc, expect: str) -> str:
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1, proc.stderr
  assert expect in errors[0], errors[0]
  return errors[0]



def test_a_killed_worker_fails_the_run_within_30_s_naming_it(tmp_path):
  out = tmp_path / "runs.jsonl"
  launched = Launched([*LAUNCH_2X2, *TRAIN, MESH_2X2, "--steps=100000", "--log_every=1",
                        f"--results={out}"])
  launched.wait_for("step 2/")
  launched.worker(1).kill()
  killed_at = time.monotonic()
  stderr = launched.finish(timeout=60)
  assert time.monotonic() - killed_at < 30, stderr[-4000:]
  assert launched.proc.returncode == 1
  chief_error = [line for line in error_lines(stderr) if "run failed" in line]
  assert len(chief_error) == 1 and "worker 1 (127.0.0.1:" in chief_error[0], stderr[-3000:]
  [record] = results.read(str(out))[0]
  assert record["status"] == "failed" and "worker 1" in record["error"]
  assert len(record["losses"]) >= 3  # the warmup step and at least 2 measured ones


def test_a_run_drives_every_workers_devices_and_ctrl_c_ends_every_child(tmp_path):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.launch", *LAUNCH_2X2, *TRAIN, MESH_2X2, "--steps=2",
                 f"--results={out}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  [record] = results.read(str(out))[0]
  assert record["status"] == "ok" and record["strategy"] == "multi_worker"
  assert record["num_processes"] == 2 and record["num_devices"] == 4
  workers = record["env"]["accelerators"]
  assert [w["task"] for w in workers] == [f"/job:worker/replica:0/task:{i}" for i in (0, 1)]
  assert [w["count"] for w in workers] == [2, 2]
  assert all(w["address"].startswith("127.0.0.1:") for w in workers)
  # Workers on loopback: this machine, named as a local run names it.
  assert record["nodes"] == [provenance.this_node()] and record["num_nodes"] == 1
  assert record["tokens_per_sec"] > 0 and len(record["losses"]) == 3
  # A decoder's record (tests/e2e/test_train_cli.py trains an encoder-decoder).
  assert record["arch"] == "decoder" and record["inputs_length"] is None
  assert record["tokens_per_step"] == 4 * 128

  # Ctrl-C to the launcher mid-run: every child ends, the record above stays intact.
  before = out.read_text()
  launched = Launched([*LAUNCH_2X2, *TRAIN, MESH_2X2, "--steps=100000",
                        f"--results={out}"])
  launched.wait_for("warmup done")
  children = psutil.Process(launched.proc.pid).children(recursive=True)
  launched.proc.send_signal(signal.SIGINT)
  stderr = launched.finish(timeout=60)
  assert launched.proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
  assert "interrupted" in error_lines(stderr)[-1]
  assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
  assert out.read_text().startswith(before)
  records, problems = results.read(str(out))
  assert not problems and records[0]["status"] == "ok"


def test_workers_that_do_not_start_in_time_are_one_clear_line():
  proc = run_cli("tf_tput.launch", "--num_workers=2", "--start_timeout_s=0.3", *EXPOSE,
                 *TRAIN, timeout=60)
  _one_error_line(proc, "were not serving within --start_timeout_s=0.3")


@pytest.fixture
def busy_port():
  s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  s.bind(("127.0.0.1", 0))
  s.listen()
  yield s.getsockname()[1]
  s.close()


def test_a_launcher_port_in_use_is_one_clear_line(busy_port):
  proc = run_cli("tf_tput.launch", "--num_workers=1", f"--port={busy_port - 1}", *TRAIN)
  assert proc.returncode == 2
  _one_error_line(proc, f"port(s) {busy_port} of {busy_port - 1}-{busy_port} are in use")


def _tf_config(chief: str, workers: list, task=None) -> str:
  return json.dumps({"cluster": {"chief": [chief], "worker": workers},
                     "task": task or {"type": "chief", "index": 0}})


def _train_with(tf_config: str, tmp_path, *args, appends: bool = False):
  """train as the chief of tf_config; refused before it starts (nothing appended), or
  when `appends`, a failed run that appends its record."""
  out = tmp_path / "runs.jsonl"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), TF_CONFIG=tf_config)
  proc = subprocess.run([sys.executable, "-m", "tf_tput.train", *TRAIN[4:], *args,
                         f"--results={out}"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
  if appends:
    [record] = results.read(str(out))[0]
    assert record["status"] == "failed" and record["error"] in error_lines(proc.stderr)[0]
  else:
    assert not out.exists()
  return proc


def test_a_chief_port_in_use_is_one_clear_line(busy_port, tmp_path):
  proc = _train_with(_tf_config(f"127.0.0.1:{busy_port}", ["127.0.0.1:1"]), tmp_path)
  _one_error_line(proc, f"chief address 127.0.0.1:{busy_port}: port {busy_port} is in use")


def test_a_worker_that_never_answers_is_named_within_the_timeout(tmp_path):
  chief, worker = processes.free_loopback_ports(2)
  proc = _train_with(_tf_config(f"127.0.0.1:{chief}", [f"127.0.0.1:{worker}"]), tmp_path,
                     "--cluster_timeout_s=1", appends=True)  # past the check: recorded
  assert proc.returncode == 1
  _one_error_line(proc, f"worker 0 (127.0.0.1:{worker}, /job:worker/replica:0/task:0) "
                        "did not answer within --cluster_timeout_s=1")


# Every other malformed TF_CONFIG is covered in tests/unit/test_cluster.py.
@pytest.mark.parametrize("tf_config, expect", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    (_tf_config("127.0.0.1:2222", ["127.0.0.1:2223"], {"type": "worker", "index": 1}),
     "task is {'type': 'worker', 'index': 1}; a worker's must be"),
])
def test_a_bad_tf_config_is_one_clear_line(tf_config, expect, tmp_path):
  start = time.monotonic()
  _one_error_line(_train_with(tf_config, tmp_path), expect)
  assert time.monotonic() - start < 30  # refused before TensorFlow starts
