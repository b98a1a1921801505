"""tf_tput/micro/sizing.py and the checked matmul: sizes from one injected rate."""

import itertools

import pytest

from tf_tput import micro
from tf_tput.micro import sizing


def test_the_size_for_a_rate_and_a_duration_is_exact():
  # 1 ms at 2 GFLOP/s is 2e6 FLOPs = 2 n**3: n = 100.
  assert sizing.matmul_n(1.0, 2e9) == 100
  assert sizing.matmul_n(8.0, 2e9) == 200      # 8x the time, 2x the side
  assert sizing.matmul_n(1.0, 2e9 * 1.5 ** 3) == 150


def test_sizes_from_one_rate_grow_with_the_duration():
  durations = [0.01, 0.1, 0.3, 1, 3, 10, 30, 100]
  for rate in (1e8, 3.7e9, 2e11):
    sizes = sizing.sizes(durations, rate)
    ordered = [sizes[ms] for ms in durations]
    assert ordered == sorted(ordered)
  # Away from the clamp, 10x the duration is a strictly larger matmul.
  sizes = sizing.sizes([0.3, 3], 1e9)
  assert sizes[3] > sizes[0.3]


def test_a_tiny_duration_is_clamped_to_the_smallest_matmul():
  assert sizing.matmul_n(1e-9, 1e9) == sizing.MIN_N == 8
  assert sizing.matmul_n(1e-3, 1e6) == 8


@pytest.mark.parametrize("ms,rate", [(0, 1e9), (-1, 1e9), (1, 0), (1, float("nan"))])
def test_a_nonpositive_duration_or_rate_is_refused(ms, rate):
  with pytest.raises(ValueError, match="must both be > 0"):
    sizing.matmul_n(ms, rate)


def _clock(times):
  ticks = iter(times)
  return lambda: next(ticks)


def test_the_rate_is_the_best_of_runs_each_at_least_min_s():
  n = sizing.MIN_N
  # Run 1: matmuls end at 0.05 and 0.10 s (2 in 0.10 s); run 2: one in 0.20 s.
  rate = sizing.matmul_rate(n=n, min_s=0.1, runs=2,
                            clock=_clock([0.0, 0.05, 0.10, 1.0, 1.2]))
  assert rate == pytest.approx(2 * sizing.flops(n) / 0.10)


def test_the_measured_duration_is_the_median_matmul():
  starts_ends = [0, 0.002, 1, 1.005, 2, 2.003]
  assert sizing.measured_ms(8, repeats=3, clock=_clock(starts_ends)) == pytest.approx(3)


def test_with_a_matmul_every_computation_adds_two():
  spec = micro.Spec("tf", "opbyop", 1, 2)
  assert micro.expected(spec, 16) == 16
  assert micro.expected(micro.Spec("tf", "opbyop", 1, 2, matmul_n=8), 16) == 32


def _jax_step_value(matmul_n):
  import jax
  from tf_tput.micro import jax_host
  spec = micro.Spec("jax", "opbyop", hosts=1, devices_per_host=len(jax.devices()),
                    matmul_n=matmul_n)
  step, _, x, a = jax_host._programs(spec)
  return spec, jax_host._value(step(x, a))


def test_the_jax_computation_adds_its_matmul():
  spec, value = _jax_step_value(16)
  assert value == micro.expected(spec, 1) == 2


def test_a_matmul_that_contributes_nothing_breaks_the_check(monkeypatch):
  # Zeros multiply to zero, as a skipped matmul would leave: the value is off by one.
  monkeypatch.setattr(micro, "MATMUL_FILL", 0.0)
  spec, value = _jax_step_value(16)
  with pytest.raises(micro.CheckError, match="got 1, expected 2"):
    micro.check(value, micro.expected(spec, 1), "jax")


def test_each_calibration_run_stops_at_the_first_matmul_past_min_s():
  # Every matmul here "takes" 0.5 s: 3 runs x (1 start + 1 end) clock reads.
  ticks = itertools.count(0, 0.5)
  sizing.matmul_rate(n=8, min_s=0.1, runs=3, clock=lambda: next(ticks))
  assert next(ticks) == 0.5 * 6


# Sizes whose float32 reciprocal times n is below 1: a graph that divides (A @ A)[0, 0]
# by n as a multiply by 1/n and casts to an integer would add 0 for them.
RECIPROCAL_BELOW_ONE = (41, 249)


def test_the_sizes_below_are_ones_a_reciprocal_multiply_rounds_down():
  import numpy as np
  for n in RECIPROCAL_BELOW_ONE:
    assert np.float32(n) * (np.float32(1) / np.float32(n)) < 1


@pytest.mark.parametrize("n", RECIPROCAL_BELOW_ONE)
def test_the_jax_matmul_term_is_one_for_every_size(n):
  spec, value = _jax_step_value(n)
  assert value == micro.expected(spec, 1) == 2


@pytest.mark.parametrize("n", RECIPROCAL_BELOW_ONE)
def test_the_tf_graph_matmul_term_is_one_for_every_size(n):
  # A crossover run at n=249 once checked "got 333, expected 666": the graph's
  # corner / n was 0.99999994 and cast to 0.
  import tensorflow as tf
  from tf_tput.micro import tf_single
  graph = tf.Graph()
  with graph.as_default():
    a = tf.compat.v1.Variable(tf.fill([n, n], micro.MATMUL_FILL))
    x = tf.constant(0)
    term = tf_single._plus_matmul(tf, x, a, "/device:CPU:0")
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(a.initializer)
      assert session.run(term) == 1



def _record(system: str, rate):
  """A crossover run's record: its rate, or (a status) a run that gave none."""
  ok = isinstance(rate, float)
  return {"system": system, "status": "ok" if ok else rate,
          "computations_per_sec": rate if ok else None}


def test_the_crossover_says_why_no_duration_reached_jax():
  def result(tf_small, jax_small, tf_large, jax_large):
    records = {("tf", 0.3): _record("tf", tf_small), ("jax", 0.3): _record("jax", jax_small),
               ("tf", 3.0): _record("tf", tf_large), ("jax", 3.0): _record("jax", jax_large)}
    return micro.crossover_result("tf", [0.3, 3.0], records, 0.95, lambda ms: f"{ms:g} ms")

  assert result(50.0, 100.0, 96.0, 100.0) == "3 ms"
  # None failed: how near it came, and no word of a failure.
  assert result(50.0, 100.0, 71.0, 100.0) == (
      "not reached up to 3 ms: at most 71% of jax's rate, at 3 ms")
  # A run that gave no rate is named with its duration and status.
  assert result(50.0, 100.0, "failed", 100.0) == (
      "not reached up to 0.3 ms: at most 50% of jax's rate, at 0.3 ms; no rate at 3 ms "
      "(tf failed)")
  assert result("skipped", "failed", "skipped", 100.0) == (
      "not measured; no rate at 0.3 ms (tf skipped, jax failed), 3 ms (tf skipped)")
