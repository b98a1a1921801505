"""tf_tput/micro/ray_actors.py: Ray actors with a gloo AllReduce, every mode, cleanup.

Each run starts a private Ray cluster (a few seconds on two cores) and must stop all
of it: after every test, no process created during the test is left running.
"""

import time
import uuid

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
import psutil  # noqa: E402  (after ray: the copy Ray vendors, like the module's)

from tf_tput import micro  # noqa: E402
from tf_tput.micro import ray_actors  # noqa: E402

MARK = "TF_TPUT_TEST_PROCESS_MARK"


def fast_spec(mode, hosts=2, **overrides):
  fields = dict(devices_per_host=2, chain_length=8, computations=16, repeats=2,
                timeout_s=120.0)
  fields.update(overrides)
  return micro.Spec("ray", mode, hosts, **fields)


def started_since(start: float, mark: str) -> list:
  """Live processes created since `start` by this test: descendants of this process,
  or carrying its mark in their environment (orphans keep it). Others' processes on
  a shared machine are not this test's."""
  me = psutil.Process()
  mine = {p.pid for p in me.children(recursive=True)}
  found = []
  for p in psutil.process_iter():
    try:
      if p.pid == me.pid or p.create_time() < start or (
          p.status() == psutil.STATUS_ZOMBIE):
        continue
      if p.pid in mine or p.environ().get(MARK) == mark:
        found.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
    except psutil.Error:
      continue
  return found


@pytest.fixture(autouse=True)
def no_process_outlives_the_test(monkeypatch):
  mark = uuid.uuid4().hex
  monkeypatch.setenv(MARK, mark)
  start = time.time() - 0.05  # create_time has the kernel's tick resolution
  yield
  assert not started_since(start, mark), "left running after run()"


def test_ray_is_available():
  assert ray_actors.unavailable() is None
  assert ray_actors.MODES == ("opbyop", "chained", "fused")


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("mode", ["opbyop", "chained", "fused"])
def test_every_mode_runs_checked_computations(mode, hosts):
  times = ray_actors.run(fast_spec(mode, hosts))
  assert len(times) == 2
  assert all(isinstance(t, float) and t > 0 for t in times)


def test_matmul_before_the_allreduce():
  times = ray_actors.run(fast_spec("chained", matmul_n=32))
  assert len(times) == 2 and all(t > 0 for t in times)


def test_check_rejects_a_wrong_value():
  micro.check(16, 16, "here")
  with pytest.raises(micro.CheckError, match="host 1: got 15, expected 16"):
    micro.check(15, 16, "host 1")


def test_a_wrong_result_fails_the_run_and_stops_the_cluster(monkeypatch):
  # The driver expects one more than the AllReduce produces: the first check fails.
  monkeypatch.setattr(ray_actors, "_expected", lambda done: done + 1)
  with pytest.raises(micro.CheckError, match="ray host 0 device 0 after 8 "
                     "computations: got 8, expected 9"):
    ray_actors.run(fast_spec("fused"))


def test_a_timeout_fails_the_run_and_stops_the_cluster():
  # Ray's start-up alone takes longer: the run stops at its first wait.
  with pytest.raises(TimeoutError, match="ray: timed out"):
    ray_actors.run(fast_spec("opbyop", timeout_s=0.5))

