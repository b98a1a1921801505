"""A framework's fastest GEMM path on this CPU, chosen by the peak probe's matmul.

One framework may multiply through several libraries, and which is fastest depends
on the CPU: on a 2-core AMD EPYC with AVX2 only, TF's Eigen reached 122 GFLOP/s and
its oneDNN 170 (TF turns oneDNN on by default only where the CPU has AVX-512 VNNI,
BF16 or AMX); on AMD Zen 5, torch's MKL sgemm reached under half of what oneDNN does.
A runtime that offers paths names them, each as the environment that selects it
(read when the framework loads); tf_tput.runtime.Runtime's defaults offer none:

    gemm_paths(strategy, dtype) -> {name: {variable: value}}   # {} or one: no choice
    gemm_paths_named_only -> (name, ...)   # run where named, never probed

A path named only is one whose probe misleads (it wins the one large matmul and
loses on the model's): --gemm or its environment runs it; auto does not probe it.

Each path is probed once per machine: the peak probe's n x n matmul (peak.py), in a
child process started with that path's environment (the caller's probe: train passes
tf_tput/gemm_probe.py's, which loads the system, a layer above this package), kept in
the peak store under the path's name (PeakStore.for_gemm). The fastest is set in
this process's environment before the framework loads, and its peak is the run's.
The record's env.gemm says which path ran, how it was chosen and what every path's
probe gave.
"""

import os
import subprocess
from typing import Callable, Optional

from tf_tput.errors import UsageError
from tf_tput.measure import peak as peak_lib

AUTO = "auto"  # --gemm's default: the fastest path's probe


def paths(runtime, strategy: str, dtype: str) -> dict:
  """The runtime's GEMM paths for this run ({} where it offers none)."""
  return dict(runtime.gemm_paths(strategy, dtype))


def named_only(runtime, offered: dict) -> tuple:
  """The offered paths that auto neither probes nor chooses."""
  return tuple(name for name in runtime.gemm_paths_named_only if name in offered)


def check(runtime, strategy: str, dtype: str, requested: str) -> None:
  """--gemm names a path the runtime offers here, or is auto: UsageError in one line;
  asking for the paths also checks a path the environment names (the runtime's
  UsageError)."""
  offered = paths(runtime, strategy, dtype)
  if requested != AUTO and requested not in offered:
    raise UsageError(f"--gemm={requested}: {runtime.name} offers "
                     f"{', '.join(offered) or 'no GEMM paths'} here (strategy "
                     f"{strategy}, {dtype}); use one of those or --gemm={AUTO}")


def choose(runtime, strategy: str, dtype: str, store,
           probe: Callable[[dict, str], float], requested: str = AUTO) -> Optional[dict]:
  """Sets the chosen path's environment in this process and returns the record's
  env.gemm ({"path", "chosen_by", "probed_gflops"}), or None where the runtime offers
  no paths. probe(environment, dtype) -> FLOP/s of the peak probe's matmul under a
  path's environment, in a child process (RuntimeError, OSError, ValueError or
  subprocess.TimeoutExpired where it fails). auto: every path's kept probe, or a new
  one (kept), the fastest chosen; under the store's lock, so the processes of one run
  on one host probe one at a time and choose alike. A path whose probe fails is not
  chosen, its error recorded; where every one fails, the first path runs. Paths named
  only are neither probed nor chosen, and recorded as not probed; where every path
  offered is named only, the first runs."""
  offered = paths(runtime, strategy, dtype)
  if not offered:
    return None
  probed = {}
  # The one path offered runs, named only or not (its variable named it, say).
  skipped = named_only(runtime, offered) if len(offered) > 1 else ()
  candidates = {name: env for name, env in offered.items() if name not in skipped}
  if requested != AUTO:
    chosen, chosen_by = requested, "--gemm"
  elif len(offered) == 1:
    chosen, chosen_by = next(iter(offered)), "the only path offered"
  elif len(candidates) <= 1:
    chosen = next(iter(candidates or offered))
    chosen_by = ("the only path auto chooses" if candidates
                 else "every path is named only: the first")
  else:
    with store.locked():
      for name, environment in candidates.items():
        path_store = store.for_gemm(name)
        kept = path_store.get(runtime.name, dtype, peak_lib.MATMUL_PEAK_SIZE)
        try:
          flops = kept.flops if kept else probe(environment, dtype)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as e:
          probed[name] = f"probe failed: {e}"
          continue
        if not kept:
          path_store.put(runtime.name, dtype, peak_lib.MATMUL_PEAK_SIZE, flops,
                         locked=True)
        probed[name] = round(flops / 1e9, 1)
    numbers = {name: value for name, value in probed.items()
               if isinstance(value, float)}
    chosen = max(numbers, key=numbers.get) if numbers else next(iter(candidates))
    chosen_by = ("the fastest probe" if numbers
                 else "every probe failed: the first path")
  if requested == AUTO:
    probed.update({name: f"not probed: runs only where --gemm={name} or "
                         f"{' '.join(f'{k}={v}' for k, v in offered[name].items())} "
                         "names it" for name in skipped})
  os.environ.update(offered[chosen])
  return {"path": chosen, "chosen_by": chosen_by, "probed_gflops": probed}
