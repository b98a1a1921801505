"""Every wait for something outside the process ends within its flag's timeout, in an
error that names the address and the flag: a Cloud TPU's master, the JAX coordinator,
the Ray hosts. (TF workers: tests/unit/test_cluster.py; whole runs that time out:
tests/e2e/test_train_failures.py.)"""

import socket
import threading
import time
import types

import pytest

from tf_tput.runtime import launchers, processes
from tf_tput.runtime.tpu import TpuAddress
from tf_tput.systems.jax import runtime as jax_runtime
from tf_tput.systems.tensorflow import tpu as tf_tpu


@pytest.mark.loopback_ports  # a port found free must stay unanswered (tests/conftest.py)
def test_a_tpu_master_where_nothing_listens_times_out_naming_it_and_the_flag():
  [port] = processes.free_loopback_ports(1)
  master = f"grpc://127.0.0.1:{port}"
  start = time.monotonic()
  with pytest.raises(TimeoutError) as raised:
    tf_tpu.wait_for_master(TpuAddress(master), master, 0.5)
  assert 0.5 <= time.monotonic() - start < 5
  assert (f"--tpu={master}: nothing answered at {master} within --cluster_timeout_s=0.5"
          in str(raised.value))


def test_a_listening_tpu_master_or_a_local_tpu_needs_no_wait():
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    master = f"grpc://127.0.0.1:{listener.getsockname()[1]}"
    tf_tpu.wait_for_master(TpuAddress(master), master, 0.5)
  tf_tpu.wait_for_master(TpuAddress("local"), "", 0.001)  # this host's own chips


class _FakeJax:
  """jax with a distributed.initialize that waits until released, or fails at once."""

  def __init__(self, error=None):
    self.released, self.error, self.kwargs = threading.Event(), error, None
    self.distributed = types.SimpleNamespace(initialize=self._initialize)

  def _initialize(self, **kwargs):
    self.kwargs = kwargs
    if self.error:
      raise self.error
    self.released.wait(30)


def test_a_jax_coordinator_that_never_gathers_everyone_times_out_naming_it_and_the_flag():
  jax = _FakeJax()
  start = time.monotonic()
  with pytest.raises(TimeoutError) as raised:
    jax_runtime.join_processes(jax, _launch("127.0.0.1:1234", 2, 1), 0.5)
  jax.released.set()
  assert 0.5 <= time.monotonic() - start < 5
  assert ("process 1: the JAX coordinator at 127.0.0.1:1234 did not gather all 2 "
          "processes within --cluster_timeout_s=0.5") in str(raised.value)
  # JAX's own deadline, which ends the process, comes well after ours.
  assert jax.kwargs["initialization_timeout"] >= 1 + jax_runtime.ABORT_MARGIN_S


def test_a_jax_initialize_that_fails_fails_in_the_caller():
  with pytest.raises(ConnectionError, match="refused"):
    jax_runtime.join_processes(_FakeJax(ConnectionError("refused")),
                               _launch("127.0.0.1:1", 2, 0), 5)


def test_jax_joins_slurm_and_mpirun_processes_by_its_own_detection():
  for launcher, method in (("slurm", "slurm"), ("mpirun", "ompi")):
    jax = _FakeJax(ConnectionError("refused"))
    with pytest.raises(ConnectionError):
      jax_runtime.join_processes(jax, launchers.Launch(launcher, 2, 0, coordinator="h:1"), 5)
    assert jax.kwargs["cluster_detection_method"] == method
    assert "coordinator_address" not in jax.kwargs


def _launch(coordinator, num_processes, process_id):
  return launchers.Launch("tf_tput.launch", num_processes, process_id,
                          coordinator=coordinator)


def test_a_ray_wait_past_the_deadline_names_where_and_the_flag():
  from tf_tput.systems.torch.ray import cluster as ray_cluster

  class GetTimeoutError(Exception):
    pass

  def get(refs, timeout):
    raise GetTimeoutError()

  ray = types.SimpleNamespace(get=get, exceptions=types.SimpleNamespace(
      GetTimeoutError=GetTimeoutError))
  deadline = ray_cluster.Deadline(time.monotonic() + 5, 5.0,
                                  "the run's Ray cluster at 127.0.0.1:6379")
  with pytest.raises(TimeoutError) as raised:
    ray_cluster.get(ray, [], deadline, "starting the hosts")
  assert str(raised.value).startswith(
      "ray: starting the hosts on the run's Ray cluster at 127.0.0.1:6379 did not finish "
      "within --timeout_s=5")
  past = ray_cluster.Deadline(time.monotonic() - 1, 5.0)
  with pytest.raises(TimeoutError, match="--timeout_s=5"):
    ray_cluster.get(ray, [], past, "joining the process group")
