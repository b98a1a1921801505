"""TF single-controller micro-benchmark: every mode runs, checks bite, servers never leak.

Each run starts real tf.distribute.Server processes on loopback. After every test,
no process this test started is left running (tests/conftest.py).
"""

import json
import os
import signal
import time

import psutil
import pytest

from tf_tput import micro
from tf_tput.micro import tf_single
from tf_tput.systems.tensorflow import workers as tf_workers


pytestmark = pytest.mark.usefixtures("no_leftover_processes")


def _spec(mode, hosts=2, **overrides):
  fields = dict(system="tf", mode=mode, hosts=hosts, devices_per_host=2,
                chain_length=8, computations=16, repeats=2, timeout_s=120.0)
  fields.update(overrides)
  return micro.Spec(**fields)


# At one host; tests/e2e/test_micro_cli.py runs every mode at two hosts (checked the
# same way), and so do the matmul and wrong-data tests below.
@pytest.mark.parametrize("mode", tf_single.MODES)
def test_every_mode_runs_and_times_each_repeat(mode):
  seconds = tf_single.run(_spec(mode, hosts=1))
  assert len(seconds) == 2
  assert all(isinstance(s, float) and s > 0 for s in seconds)


def test_a_matmul_runs_before_the_allreduce():
  seconds = tf_single.run(_spec("fused", matmul_n=64))
  assert len(seconds) == 2 and all(s > 0 for s in seconds)


def test_a_matmul_that_contributes_nothing_fails_the_check(monkeypatch):
  # A matrix of zeros: its product adds 0, as a skipped matmul would; each computation
  # then adds 1, not 2, and the warmup's check fails.
  monkeypatch.setattr(micro, "MATMUL_FILL", 0.0)
  with pytest.raises(micro.CheckError, match="got 16, expected 32"):
    tf_single.run(_spec("fused", hosts=1, matmul_n=16))


def test_the_module_follows_the_system_contract():
  assert tf_single.unavailable() is None
  assert micro.system_module("tf") is tf_single
  assert set(tf_single.MODES) == set(micro.MODES)


def test_check_raises_on_a_wrong_value():
  micro.check(16, 16, "right")
  with pytest.raises(micro.CheckError, match="got 17, expected 16"):
    micro.check(17, 16, "wrong")


def _server_addresses():
  """The cluster's addresses, as the running tf_server processes were told them."""
  for p in psutil.Process().children(recursive=True):
    tf_config = p.environ().get("TF_CONFIG")
    if tf_config:
      return json.loads(tf_config)["cluster"]["worker"]
  raise AssertionError("no tf_server process is running")


def _corrupt_on_worker(address, task, value):
  """Another client overwrites x on task:<task>/CPU:0, in the worker's shared state."""
  import tensorflow as tf
  device = f"/job:worker/replica:0/task:{task}/device:CPU:0"
  graph = tf.Graph()
  with graph.as_default(), tf.device(device):
    x = tf.compat.v1.Variable(0, dtype=tf.int32, name=tf_single.variable_name(device))
    assign = x.assign(value)
  with tf.compat.v1.Session(f"grpc://{address}", graph=graph) as session:
    session.run(assign, options=tf.compat.v1.RunOptions(timeout_in_ms=30_000))


def test_wrong_data_on_a_server_fails_the_run(monkeypatch):
  """After the warmup's check, a worker's state is overwritten; the next check fails."""
  real_check = micro.check
  checks = []

  def check_then_corrupt(value, expected, where):
    real_check(value, expected, where)
    checks.append(where)
    if len(checks) == 4:  # the warmup's 4 devices are checked: corrupt host 1's state
      _corrupt_on_worker(_server_addresses()[0], task=1, value=1000)

  monkeypatch.setattr(micro, "check", check_then_corrupt)
  with pytest.raises(micro.CheckError, match="repeat 1"):
    tf_single.run(_spec("opbyop"))
  assert len(checks) == 4


def test_a_run_out_of_time_raises_and_stops_its_servers():
  start = time.monotonic()
  with pytest.raises(TimeoutError, match="timeout_s=0.5"):
    tf_single.run(_spec("chained", timeout_s=0.5))
  assert time.monotonic() - start < 0.5 + tf_single.STOP_GRACE_S + 2


def test_a_server_that_dies_at_start_is_named_with_its_log(monkeypatch):
  monkeypatch.setattr(tf_workers, "SERVER_MODULE", "tf_tput.micro.no_such_server")
  with pytest.raises(RuntimeError, match=r"worker \d .*exited with code 1.*No module"):
    tf_single.run(_spec("opbyop"))


def test_ctrl_c_stops_the_servers(monkeypatch):
  def interrupt(value, expected, where):
    os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C mid-run
    time.sleep(1)

  monkeypatch.setattr(micro, "check", interrupt)
  with pytest.raises(KeyboardInterrupt):
    tf_single.run(_spec("fused", hosts=1))


def test_a_bad_spec_is_refused_before_any_server_starts():
  with pytest.raises(ValueError, match="multiple of chain_length"):
    tf_single.run(_spec("chained", computations=12))
  with pytest.raises(ValueError, match="mode"):
    tf_single.run(_spec("pipelined"))
