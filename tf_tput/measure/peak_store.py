"""Measured CPU peaks kept on disk, so that a machine is probed once, not every run.

A probe of the same matmul on the same CPU moved 181-252 GFLOP/s between runs
minutes apart, so MFU from per-run probes compares noise, and every run paid seconds
for it. A peak is kept per (CPU model, cores, framework and its version, GEMM path
where the framework has several (gemm.py), dtype, matmul size, and the CPUs the
process may use where a launcher bound it to fewer than the host's) in one JSON file
under the user's cache directory, with when it was measured; runs read it, and
--reprobe_peak measures again and replaces it. A record's peak_source names the
stored probe it used and when it was measured (tf_tput/measure/peak.py).
"""

import contextlib
import dataclasses
import fcntl
import json
import os
import tempfile
from typing import Optional

from tf_tput.records import build, provenance
from tf_tput.runtime import cpus

FILE_NAME = "peaks.json"


@dataclasses.dataclass(frozen=True)
class Stored:
  flops: float        # FLOP/s of the whole CPU, before sharing among virtual devices
  measured_at: str    # ISO-8601 UTC


class PeakStore:
  """The peaks file of one framework's runs: `versions` are its distributions'
  versions (a new release may multiply faster), and its GEMM path's name where it has
  several (for_gemm). reprobe: get() finds nothing, so the run measures and put()
  replaces what was kept."""

  def __init__(self, path: str, versions: dict, reprobe: bool = False):
    self.path, self.versions, self.reprobe = path, versions, reprobe

  def for_gemm(self, path_name: Optional[str]) -> "PeakStore":
    """The same file, its peaks those of one GEMM path (None: this store)."""
    if path_name is None:
      return self
    return PeakStore(self.path, {**self.versions, "gemm": path_name}, self.reprobe)

  def _key(self, framework: str, dtype: str, n: int) -> str:
    mine = cpus.allowed()
    # The CPUs this process may use, as many as the host's or fewer (a launcher's
    # binding, runtime/cpus.py): a bound run's peak is that of its CPUs.
    return json.dumps([provenance.cpu_model(), cpus.host_count(), framework,
                       sorted(self.versions.items()), dtype, n]
                      + ([] if len(mine) == cpus.host_count() else [cpus.as_list(mine)]))

  def get(self, framework: str, dtype: str, n: int) -> Optional[Stored]:
    if self.reprobe:
      return None
    entry = self._read().get(self._key(framework, dtype, n))
    try:
      return Stored(float(entry["flops"]), str(entry["measured_at"]))
    except (TypeError, KeyError, ValueError):  # none, or not one of ours
      return None

  def put(self, framework: str, dtype: str, n: int, flops: float,
          locked: bool = False) -> None:
    """Keeps a probe measured now; a store that cannot be written is no error (the
    run has its peak), only the next run probes again. locked: the caller holds
    locked() already."""
    measured_at = build.utc_now()
    with contextlib.suppress(OSError), (
        contextlib.nullcontext() if locked else self.locked()):
      peaks = self._read()
      peaks[self._key(framework, dtype, n)] = {"flops": flops, "measured_at": measured_at}
      fd, scratch = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".peaks-")
      with os.fdopen(fd, "w") as f:
        json.dump(peaks, f, indent=1, sort_keys=True)
      os.replace(scratch, self.path)  # readers see the old file or the new, whole

  @contextlib.contextmanager
  def locked(self):
    """Runs in parallel (a suite, the tests, one run's processes) add their probes
    one at a time, and gemm.choose probes while holding it."""
    os.makedirs(os.path.dirname(self.path), exist_ok=True)
    with open(self.path + ".lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      yield

  def _read(self) -> dict:
    try:
      with open(self.path) as f:
        peaks = json.load(f)
    except (OSError, ValueError):
      return {}
    return peaks if isinstance(peaks, dict) else {}
