"""The crossover's matmul sizes (Fig. 6): one calibrated rate, every size from it.

Sizing each requested duration from its own short timing let load on a shared
machine reorder the sizes (a matmul for 3 ms once came out smaller than the one for
0.3 ms). So an invocation calibrates numpy's float32 matmul rate ONCE (matmul_rate:
the best of CALIBRATION_RUNS measurements, each repeating an n x n matmul for at least
CALIBRATION_MIN_S, so a burst of load lowers one measurement, not the best) and
derives every size from that rate (matmul_n), monotonic in the duration by
construction. How long the chosen size really takes here (measured_ms) is recorded
beside the requested duration: small matmuls run below the calibrated rate.

The matrix is all ones (micro.MATMUL_FILL): (A @ A)[0, 0] is exactly n for any n
below 2**24, and every matmul timed here is checked against that.
"""

import statistics
import time
from typing import Callable

CALIBRATION_N = 512
CALIBRATION_MIN_S = 0.1
CALIBRATION_RUNS = 5
MIN_N = 8               # below this a "matmul" is a handful of scalar ops
MEASURED_REPEATS = 5    # timings of the chosen size; their median is recorded


def flops(n: int) -> float:
  return 2.0 * n ** 3


def _ones(n: int):
  import numpy as np
  return np.ones((n, n), np.float32)


def _checked_matmul(a) -> None:
  n = a.shape[0]
  corner = float((a @ a)[0, 0])
  if corner != n:
    raise RuntimeError(f"numpy {n}x{n} matmul of ones: [0, 0] is {corner}, not {n}")


def matmul_rate(n: int = CALIBRATION_N, min_s: float = CALIBRATION_MIN_S,
                runs: int = CALIBRATION_RUNS,
                clock: Callable[[], float] = time.perf_counter) -> float:
  """float32 FLOP/s of numpy's n x n matmul here: the best of `runs` measurements,
  each as many matmuls as fill at least min_s."""
  a = _ones(n)
  _checked_matmul(a)  # warm-up: allocation, thread pool start
  best = 0.0
  for _ in range(runs):
    count, start = 0, clock()
    while True:
      _checked_matmul(a)
      count += 1
      elapsed = clock() - start
      if elapsed >= min_s:
        break
    best = max(best, count * flops(n) / elapsed)
  return best


def matmul_n(ms: float, rate: float) -> int:
  """n of the n x n matmul that takes `ms` at `rate` FLOP/s (at least MIN_N)."""
  if not ms > 0 or not rate > 0:
    raise ValueError(f"matmul_n: ms={ms} and rate={rate} must both be > 0")
  return max(MIN_N, round((ms / 1e3 * rate / 2) ** (1 / 3)))


def sizes(durations_ms, rate: float) -> dict:
  """duration (ms) -> n, every one from the same rate."""
  return {ms: matmul_n(ms, rate) for ms in durations_ms}


def measured_ms(n: int, repeats: int = MEASURED_REPEATS,
                clock: Callable[[], float] = time.perf_counter) -> float:
  """Median milliseconds of one checked n x n float32 matmul here (numpy)."""
  a = _ones(n)
  _checked_matmul(a)
  times = []
  for _ in range(repeats):
    start = clock()
    _checked_matmul(a)
    times.append((clock() - start) * 1e3)
  return statistics.median(times)
