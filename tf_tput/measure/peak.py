"""Peak FLOP/s per device, the denominator of MFU: from a table, or measured on CPUs.

Accelerators (TPU, GPU) take the vendors' dense peak from PEAK_FLOPS. A CPU has no
table entry that would mean anything for a virtual device, so its peak is measured:
the best of several n x n matmuls in the run's own framework and dtype, shared by the
virtual devices that run on the same cores. `peak_source` in a record says which.
"""

import time
from typing import Callable, Optional

from tf_tput.runtime import cpus, topology as topology_lib

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


# peak_source's tail when the peak came from the store (peak_store.py).
STORED = "; stored probe of "


def _sharing(topology) -> int:
  """Devices that share one CPU share its peak: all of them on this host, else a
  worker's. A process its launcher bound to some of the host's CPUs (mpirun's
  ranks, srun --cpu-bind) probed those, each process's CPUs its own
  (runtime/cpus.py): its own devices share them. CPUs narrowed otherwise (taskset, a
  container's or a job's cpuset) are every process's alike."""
  if not topology.shares_host_cpu:
    return len(topology.workers[0].devices)
  binding = topology_lib.launched().cpu_binding
  if len(cpus.allowed()) < cpus.host_count() and binding not in (None, "none"):
    return max(1, topology.num_devices // topology.num_processes)
  return topology.num_devices


def peak(runtime, topology, dtype: str, store=None) -> tuple:
  """(peak FLOP/s per device, peak_source): measured on CPUs, from the table else.
  The runtime (tf_tput.runtime.Runtime) runs the matmul: one n x n x n matmul of ones on
  the first device, waited for and checked (check_matmul_corner); the matrix is an
  input, never a constant a compiler could fold. With a store (peak_store.PeakStore),
  this host's CPU is probed once: a kept probe is used, a new one kept."""
  if topology.platform != "cpu":
    return table_peak(topology.device_kind, dtype)
  n = MATMUL_PEAK_SIZE
  store = store if topology.shares_host_cpu else None  # a worker's CPU: another host
  kept = store.get(topology.framework, dtype, n) if store else None
  if kept:
    whole_cpu = kept.flops
  else:
    whole_cpu = measure_matmul_peak(runtime.matmul_runner(topology, n, dtype))
    if store:
      store.put(topology.framework, dtype, n, whole_cpu)
  worker_0 = topology.workers[0].address if topology.workers else topology.devices[0]
  where = f"worker 0's CPU ({worker_0})"
  if topology.shares_host_cpu:
    mine = cpus.allowed()
    where = (f"the host CPU ({cpus.host_count()} cores)" if len(mine) == cpus.host_count()
             else f"CPU(s) {cpus.as_list(mine)} of the host's {cpus.host_count()}")
  source = (f"measured: {topology.framework} {n}x{n} {dtype} matmul on {where} = "
            f"{whole_cpu / 1e9:.0f} GFLOP/s, shared by {_sharing(topology)} virtual "
            "device(s)") + (f"{STORED}{kept.measured_at} ({store.path})" if kept else "")
  return whole_cpu / _sharing(topology), source


def reprobed(runtime, topology, dtype: str, first: tuple, store=None) -> tuple:
  """A measured CPU peak, probed again after the run and the higher kept (and
  stored, with a store). A VM's cores can be slower for a second or two (seen here:
  112 GFLOP/s, then 212 a minute later and in the same run's steps), and a low peak
  inflates MFU, past 100% at worst. Table peaks, stored probes (their run was
  reprobed), unprobed processes, launched processes (whose peers may still be
  computing) and TF clusters (a lost worker would hang a new Session) keep the
  first, as does a probe that fails: the record matters more. Returns (peak per
  device, peak_source)."""
  value, source = first
  if (value is None or not source.startswith("measured") or STORED in source
      or topology.num_processes > 1 or topology.session_target or topology.workers):
    return first
  try:
    again, again_source = peak(runtime, topology, dtype)
  except Exception:  # noqa: BLE001 - a second probe only refines the first
    return first
  best, best_source = max(first, (again, again_source), key=lambda p: p[0])
  if store and topology.shares_host_cpu and again > value:
    store.put(topology.framework, dtype, MATMUL_PEAK_SIZE, again * _sharing(topology))
  return best, (f"{best_source}; the higher of two probes, before and after the run "
                f"({value / 1e9:.0f} and {again / 1e9:.0f} GFLOP/s per device)")


NOT_PROBED = "not measured on this process"


def probe_alone(runtime, topology, dtype: str, probes: bool, store=None) -> tuple:
  """peak() in the one process that probes, while no other process computes.

  The processes of tf_tput.launch share this host's cores: a peer still compiling its
  trainer would slow the probe's matmuls and understate the peak. So every process
  that runs the program waits at the runtime's barrier before the probe and another
  after it, and only then builds its trainer. A chief that drives worker servers
  needs none: the servers run nothing but what its session sends them, and it probes
  before it builds the trainer. Returns (None, NOT_PROBED) in the processes that do
  not probe.
  """
  barrier = runtime.barrier(topology)
  barrier("before the peak probe")
  result = peak(runtime, topology, dtype, store) if probes else (None, NOT_PROBED)
  barrier("after the peak probe")
  return result


# --------------------------------------------------------------------------------
# A peak_source in fewer words, for one-line summaries and report footers. The
# record keeps the whole text; these only shorten it.

SHORT_SOURCE_LIMIT = 64  # characters of short_source, at most


def short_source(peak_source: str, limit: int = SHORT_SOURCE_LIMIT) -> str:
  """'table:h200:bfloat16' as it is; a CPU probe ('measured: jax 2048x2048 float32
  matmul on the host CPU (2 cores) = 212 GFLOP/s, shared by ...') as 'measured: jax
  matmul on the host CPU'; anything else (no table entry, not probed) without its
  'none: ' and cut to `limit` characters."""
  text = peak_source
  head = peak_source.split(" = ")[0].split(";")[0]
  if head.startswith("measured: ") and " matmul on " in head:
    framework = head[len("measured: "):].split(" ")[0]
    where = head.split(" matmul on ", 1)[1].split(" (")[0]
    text = f"measured: {framework} matmul on {where}"
  elif peak_source.startswith("none: "):
    text = peak_source[len("none: "):]
  return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def source_kind(peak_source: str) -> str:
  """A peak_source without what the probe measured: the same probe on the same
  devices gives the same kind in every run ('measured: jax 2048x2048 float32 matmul on
  the host CPU (2 cores), shared by 4 virtual device(s)'); a table entry is itself."""
  first = peak_source.split(";")[0]
  head, sep, rest = first.partition(" = ")
  if not sep:
    return first
  shared = rest.partition(", shared by ")[2]
  return head + (f", shared by {shared}" if shared else "")


def flops_label(flops_per_sec: float) -> str:
  """212e9 -> '212 GFLOP/s', 989.4e12 -> '989 TFLOP/s': three significant digits."""
  for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
    if flops_per_sec >= scale * 0.9995:  # 999.9e9 rounds to 1 TFLOP/s
      return f"{flops_per_sec / scale:.3g} {unit}FLOP/s"
  return f"{flops_per_sec:.3g} FLOP/s"
