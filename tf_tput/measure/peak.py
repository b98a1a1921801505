"""Peak FLOP/s per device, the denominator of MFU: from a table, or measured on CPUs.

Accelerators (TPU, GPU) take the vendors' dense peak from PEAK_FLOPS. A CPU has no
table entry that would mean anything for a virtual device, so its peak is measured:
the best of several n x n matmuls in the run's own framework and dtype, shared by the
virtual devices that run on the same cores. `peak_source` in a record says which.
"""

import os
import time
from typing import Callable, Optional

# Dense peak FLOP/s per device as frameworks address it (a TPU v2/v3 core, a v4/v5
# chip, a GPU), from the vendors' published figures. float32 on NVIDIA Ampere and
# later is the TF32 tensor-core rate, which TensorFlow and JAX use for float32 matmuls
# by default. A missing entry gives no MFU rather than a guessed one.
PEAK_FLOPS = {
    ("tpu_v2", "bfloat16"): 22.5e12,
    ("tpu_v3", "bfloat16"): 61.5e12,
    ("tpu_v4", "bfloat16"): 275e12,
    ("tpu_v5e", "bfloat16"): 197e12,
    ("tpu_v5p", "bfloat16"): 459e12,
    ("a100", "bfloat16"): 312e12,
    ("a100", "float32"): 156e12,
    ("h100", "bfloat16"): 989.4e12,
    ("h100", "float32"): 494.7e12,
    ("h200", "bfloat16"): 989.4e12,
    ("h200", "float32"): 494.7e12,
}

# Device kinds whose name does not contain their table key.
DEVICE_KIND_ALIASES = {"tpuv5lite": "tpu_v5e"}

MATMUL_PEAK_SIZE = 2048  # n of the n x n x n matmul that measures a CPU's peak


def accelerator_key(device_kind: str) -> Optional[str]:
  """'NVIDIA H100 80GB HBM3' -> 'h100', 'TPU v3' -> 'tpu_v3'; None when unknown."""
  kind = device_kind.lower().replace(" ", "").replace("-", "")
  for alias, key in DEVICE_KIND_ALIASES.items():
    if alias in kind:
      return key
  for key in sorted({k for k, _ in PEAK_FLOPS}, key=len, reverse=True):
    if key.replace("_", "") in kind:
      return key
  return None


def table_peak(device_kind: str, dtype: str) -> tuple:
  """(peak FLOP/s per device or None, peak_source) from PEAK_FLOPS."""
  key = accelerator_key(device_kind)
  if key and (key, dtype) in PEAK_FLOPS:
    return PEAK_FLOPS[(key, dtype)], f"table:{key}:{dtype}"
  return None, f"none: no peak table entry for {device_kind!r} at {dtype}"


def measure_matmul_peak(run_matmul: Callable[[], None], n: int = MATMUL_PEAK_SIZE,
                        repeats: int = 10, budget_s: float = 1.0,
                        min_repeats: int = 3) -> float:
  """FLOP/s of the fastest of up to `repeats` n x n matmuls; run_matmul blocks until
  done.
  Stops after min_repeats once the timed matmuls have taken budget_s: where one takes
  0.1 s (float32 on 2 cores) all 10 run; where one takes a second (bfloat16 without
  native instructions can be that slow) 3 do, since every run probes, twice."""
  run_matmul()  # first call compiles / allocates
  best, spent = float("inf"), 0.0
  for done in range(1, repeats + 1):
    start = time.perf_counter()
    run_matmul()
    took = time.perf_counter() - start
    best, spent = min(best, took), spent + took
    if done >= min_repeats and spent >= budget_s:
      break
  return 2 * n ** 3 / best


def check_matmul_corner(corner, n: int, where: str) -> None:
  """The probe multiplies a matrix of ones by itself: every entry of the product is n
  (to bfloat16's rounding, 2**-8 relative), so a skipped or partial matmul fails."""
  if not abs(float(corner) - n) <= n * 2 ** -7:
    raise RuntimeError(f"{where}: the {n}x{n} matmul of ones gave [0, 0] = {corner}, "
                       f"not {n}: the peak probe did not multiply what it timed")


def matmul_runner(topology, n: int, dtype: str) -> Callable[[], None]:
  """A callable that runs one n x n x n matmul of ones on the first device, waits for
  it and checks its result (check_matmul_corner). The matrix is an input (a device
  array, a tensor, a variable), never a constant a compiler could fold."""
  where = f"{topology.framework} {dtype} peak probe"
  if topology.framework == "jax":
    import jax
    import jax.numpy as jnp
    device = jax.local_devices()[0]
    a = jax.device_put(jnp.ones((n, n), dtype=dtype), device)
    corner = jax.jit(lambda a: jnp.matmul(a, a)[0, 0])  # the whole product is computed
    return lambda: check_matmul_corner(corner(a), n, where)  # reading a value waits
  import tensorflow as tf

  if topology.session_target:
    return _session_matmul_runner(tf, topology, n, dtype, where)
  with tf.device(topology.devices[0]):
    a = tf.ones([n, n], dtype=dtype)
    b = tf.identity(a)

  def run():
    with tf.device(topology.devices[0]):
      check_matmul_corner(tf.cast(tf.matmul(a, b)[0, 0], tf.float32), n, where)
  return run


def _session_matmul_runner(tf, topology, n: int, dtype: str, where: str):
  """The matmul on the first device of a cluster, run through the cluster's master."""
  graph = tf.Graph()
  with graph.as_default(), tf.device(topology.devices[0]):
    a = tf.Variable(tf.ones([n, n], dtype=dtype))
    corner = tf.cast(tf.matmul(a, a)[0, 0], tf.float32)
  session = tf.compat.v1.Session(topology.session_target, graph=graph)
  session.run(a.initializer)
  return lambda: check_matmul_corner(session.run(corner), n, where)


def peak(topology, dtype: str) -> tuple:
  """(peak FLOP/s per device, peak_source): measured on CPUs, from the table else."""
  if topology.platform != "cpu":
    return table_peak(topology.device_kind, dtype)
  n = MATMUL_PEAK_SIZE
  whole_cpu = measure_matmul_peak(matmul_runner(topology, n, dtype))
  # Devices that share one CPU share its peak: all of them on this host, else a worker's.
  sharing = (topology.num_devices if topology.shares_host_cpu
             else len(topology.workers[0].devices))
  where = (f"the host CPU ({os.cpu_count()} cores)" if topology.shares_host_cpu
           else f"worker 0's CPU ({topology.workers[0].address})")
  source = (f"measured: {topology.framework} {n}x{n} {dtype} matmul on {where} = "
            f"{whole_cpu / 1e9:.0f} GFLOP/s, shared by {sharing} virtual device(s)")
  return whole_cpu / sharing, source


def reprobed(topology, dtype: str, first: tuple) -> tuple:
  """A measured CPU peak, probed again after the run and the higher kept. A VM's
  cores can be slower for a second or two (seen here: 112 GFLOP/s, then 212 a minute
  later and in the same run's steps), and a low peak inflates MFU, past 100% at
  worst. Table peaks, unprobed processes, launched processes (whose peers may still
  be computing) and TF clusters (a lost worker would hang a new Session) keep the
  first, as does a probe that fails: the record matters more. Returns (peak per
  device, peak_source)."""
  value, source = first
  if (value is None or not source.startswith("measured") or topology.num_processes > 1
      or topology.session_target or topology.workers):
    return first
  try:
    again, again_source = peak(topology, dtype)
  except Exception:  # pylint: disable=broad-except
    return first
  best, best_source = max(first, (again, again_source), key=lambda p: p[0])
  return best, (f"{best_source}; the higher of two probes, before and after the run "
                f"({value / 1e9:.0f} and {again / 1e9:.0f} GFLOP/s per device)")


NOT_PROBED = "not measured on this process"


def probe_alone(topology, dtype: str, probes: bool) -> tuple:
  """peak() in the one process that probes, while no other process computes.

  The processes of tf_tput.launch --num_processes share this host's cores: a peer
  still compiling its trainer would slow the probe's matmuls and understate the
  peak. So every JAX process waits at a barrier before the probe and another after
  it, and only then builds its trainer; so do tf2's multi_worker workers, which all
  run the program. mtf's multi_worker needs none: only the chief runs train and
  builds the graph; the workers are tf.distribute servers that run nothing but what
  the chief's session sends them, and the chief probes before it builds the trainer.
  Returns (None, NOT_PROBED) in the processes that do not probe.
  """
  barrier = _barrier(topology)
  barrier("before the peak probe")
  result = peak(topology, dtype) if probes else (None, NOT_PROBED)
  barrier("after the peak probe")
  return result


def _barrier(topology) -> Callable[[str], None]:
  """A wait for every process of the run: JAX processes' global sync, or for TF
  workers that all run the program (tf2 multi_worker) an all-reduce over their
  strategy; nothing for one process or a TF chief that drives servers."""
  if topology.num_processes == 1:
    return lambda name: None
  if topology.framework == "jax":
    from jax.experimental import multihost_utils
    return multihost_utils.sync_global_devices
  strategy = topology.handles.get("strategy")
  if strategy is None:
    return lambda name: None
  import tensorflow as tf

  @tf.function
  def all_reduce():
    return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, tf.constant(1.0)))
  return lambda name: all_reduce()
