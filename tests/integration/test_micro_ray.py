"""tf_tput/micro/ray_actors.py: Ray actors with a gloo AllReduce, every mode, cleanup.

Each run starts a private Ray cluster (a few seconds on two cores) and must stop all
of it: after every test, no process created during the test is left running.
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


def test_ray_is_available():
  assert ray_actors.unavailable() is None
  assert ray_actors.MODES == ("opbyop", "chained", "fused")


# At one host; tests/e2e/test_micro_cli.py runs every mode at two hosts (checked the
# same way) and the matmul test below runs at two. Each run starts a Ray cluster.
@pytest.mark.parametrize("mode", ["opbyop", "chained", "fused"])
def test_every_mode_runs_checked_computations(mode):
  times = ray_actors.run(fast_spec(mode, hosts=1))
  assert len(times) == 2
  assert all(isinstance(t, float) and t > 0 for t in times)


def test_matmul_before_the_allreduce():
  times = ray_actors.run(fast_spec("chained", matmul_n=32))
  assert len(times) == 2 and all(t > 0 for t in times)


def test_a_wrong_result_fails_the_run_and_stops_the_cluster(monkeypatch):
  # The driver expects one more than the AllReduce produces: the first check fails.
  monkeypatch.setattr(micro, "expected", lambda spec, done: done + 1)
  with pytest.raises(micro.CheckError, match="ray host 0 device 0 after 8 "
                     "computations: got 8, expected 9"):
    ray_actors.run(fast_spec("fused", hosts=1))


def test_a_timeout_fails_the_run_and_stops_the_cluster():
  # Ray's start-up alone takes longer: the run stops at its first wait.
  with pytest.raises(TimeoutError, match="did not finish within --timeout_s=0.5"):
    ray_actors.run(fast_spec("opbyop", hosts=1, timeout_s=0.5))
