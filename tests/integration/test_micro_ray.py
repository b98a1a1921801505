"""tf_tput/micro/ray_actors.py: Ray actors with a gloo AllReduce, every mode, cleanup.

A run starts a private Ray cluster (a few seconds on two cores), or reuses the one
the last run kept for as many hosts; close() and a failed run stop all of it: after
every test (close() at its end), no process created during the test is left running.
"""

import importlib.util

import pytest

from tf_tput import micro
from tf_tput.micro import ray_actors  # imports ray and torch only when it runs

# Without the ray extra every test is skipped. Found, not imported: importing torch and
# ray takes seconds, at every collection (each xdist worker's, the `alone` run's).
pytestmark = [pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                                     for m in ("ray", "torch")),
                                 reason="the ray extra (ray, torch) is not installed"),
              pytest.mark.usefixtures("no_leftover_processes")]


def fast_spec(mode, hosts=2, **overrides):
  fields = dict(devices_per_host=2, chain_length=8, computations=16, repeats=2,
                timeout_s=120.0)
  fields.update(overrides)
  return micro.Spec("ray", mode, hosts, **fields)


@pytest.fixture(autouse=True)
def _closed(no_leftover_processes):
  """ray_actors.close() after each test, before no_leftover_processes checks."""
  del no_leftover_processes
  yield
  ray_actors.close()


def test_ray_is_available():
  assert ray_actors.unavailable() is None
  assert ray_actors.MODES == ("opbyop", "chained", "fused")


# At one host; tests/e2e/test_micro_cli.py runs every mode at two hosts (checked the
# same way) and the matmul test below runs at two.
def test_every_mode_runs_checked_computations_in_one_kept_cluster():
  clusters = []
  for mode in ("opbyop", "chained", "fused"):
    times = ray_actors.run(fast_spec(mode, hosts=1))
    assert len(times) == 2
    assert all(isinstance(t, float) and t > 0 for t in times)
    clusters.append(ray_actors._kept)
  assert clusters[0] is not None and clusters.count(clusters[0]) == 3
  ray_actors.run(fast_spec("opbyop", hosts=2))  # another host count: another cluster
  assert ray_actors._kept is not clusters[0] and ray_actors._kept.num_cpus == 2


def test_matmul_before_the_allreduce():
  times = ray_actors.run(fast_spec("chained", matmul_n=32))
  assert len(times) == 2 and all(t > 0 for t in times)


def test_a_wrong_result_fails_the_run_and_stops_the_cluster(monkeypatch):
  # The driver expects one more than the AllReduce produces: the first check fails.
  monkeypatch.setattr(micro, "expected", lambda spec, done: done + 1)
  with pytest.raises(micro.CheckError, match="ray host 0 device 0 after 8 "
                     "computations: got 8, expected 9"):
    ray_actors.run(fast_spec("fused", hosts=1))
  assert ray_actors._kept is None  # stopped


def test_a_timeout_fails_the_run_and_stops_the_cluster():
  # Ray's start-up alone takes longer: the run stops at its first wait.
  with pytest.raises(TimeoutError, match="did not finish within --timeout_s=0.5"):
    ray_actors.run(fast_spec("opbyop", hosts=1, timeout_s=0.5))
  assert ray_actors._kept is None
