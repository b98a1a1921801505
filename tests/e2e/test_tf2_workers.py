"""--system=tf2 --strategy=multi_worker: tf_tput.launch --num_workers=N starts N copies
of the train program on loopback, each a worker of one MultiWorkerMirroredStrategy;
worker 0 alone appends the record, whose losses are the single-process run's."""

import json
import signal
import sys
import time

import psutil
import pytest

from tf_tput.records import results
from tf_tput.runtime import namespaces

from cli_helpers import Launched, error_lines, run_cli

pytestmark = pytest.mark.usefixtures("no_leftover_processes")

# decoder_tiny with one layer: each of the five tf2 processes here builds its model
# (~4 s less than t5_tiny's); tf2 trains t5_tiny in tests/unit/test_tf2_model.py.
TRAIN = ["--system=tf2", "--gin_file=gin/models/decoder_tiny.gin",
         "--gin_param=MeshConfig.mesh_shape = 'batch:2'",
         "--gin_param=ModelConfig.num_layers = 1",
         "--gin_param=DataConfig.targets_length = 32", "--steps=4", "--warmup_steps=1"]
# Without root (or iproute2) no private network namespace can be made: the workers then
# run in this machine's network, as --expose_servers says (test_no_exposed_servers.py).
EXPOSE = [] if namespaces.private_missing() is None else ["--expose_servers"]


def test_two_workers_train_the_two_replica_function_and_one_record_is_written(tmp_path):
  workers, local = tmp_path / "workers.jsonl", tmp_path / "local.jsonl"
  proc = run_cli("tf_tput.launch", "--num_workers=2", "--devices_per_worker=1", *EXPOSE,
                 "--", sys.executable, "-m", "tf_tput.train", *TRAIN,
                 "--strategy=multi_worker", f"--results={workers}", timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = workers.read_text().splitlines()
  assert len(lines) == 1  # worker 0 speaks for the cluster
  record = json.loads(lines[0])
  results.validate(record)
  assert (record["strategy"], record["num_processes"], record["num_devices"]) == (
      "multi_worker", 2, 2)
  assert record["tokens_per_step"] == 8 * 32  # the global batch
  proc = run_cli("tf_tput.train", *TRAIN, "--num_cpu_devices=2", f"--results={local}",
                 timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  same = json.loads(local.read_text())
  for a, b in zip(record["losses"], same["losses"], strict=True):
    assert abs(a - b) / b < 1e-5  # the same initial weights, the same reduced update


def test_a_worker_that_dies_is_named_and_the_other_stopped(tmp_path):
  start = time.monotonic()
  proc = run_cli("tf_tput.launch", "--num_workers=2", *EXPOSE, "--", sys.executable, "-c",
                 "import os, sys, time\n"
                 "if os.environ['TF_TPUT_PROCESS_ID'] == '1': sys.exit(3)\n"
                 "time.sleep(600)\n", "--system=tf2", timeout=120)  # run on every worker
  assert time.monotonic() - start < 30 and proc.returncode == 1
  lines = error_lines(proc.stderr)
  assert len(lines) == 1 and "process 1" in lines[0] and "exited with code 3" in lines[0]


def test_ctrl_c_stops_every_worker_and_worker_0_records_what_it_measured(tmp_path):
  out = tmp_path / "runs.jsonl"
  launched = Launched(["--num_workers=2", "--devices_per_worker=1", "--grace_s=2", *EXPOSE,
                       "--", sys.executable, "-m", "tf_tput.train", *TRAIN[:-2],
                       "--steps=100000", "--warmup_steps=1", "--log_every=1",
                       "--strategy=multi_worker", f"--results={out}"])
  launched.wait_for("warmup done")  # both workers are inside the strategy's steps
  children = psutil.Process(launched.proc.pid).children(recursive=True)
  assert len(children) >= 2
  launched.proc.send_signal(signal.SIGINT)
  start = time.monotonic()
  stderr = launched.finish(timeout=60)
  assert time.monotonic() - start < 30
  assert launched.proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
  assert "interrupted" in error_lines(stderr)[-1]
  assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
  [record] = results.read(str(out))[0]  # worker 0's only
  assert (record["status"], record["signal"]) == ("interrupted", "SIGTERM")
  assert record["num_processes"] == 2 and len(record["losses"]) >= 1  # warmup done
