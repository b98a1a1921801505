"""The peak probe's matmul under one GEMM path, in a process of its own.

    python -m tf_tput.gemm_probe SYSTEM DTYPE N

A GEMM path is the environment a framework loads under (measure/gemm.py), so train
probes each path in a child: probe_in_child starts this module with the path's
environment added, and here the system's framework loads under it, runs the probe on
the host CPU with every core, and prints one JSON line, {"flops": ...}. Internal:
started by train (gemm.choose's probe), never by a user. It loads a system, so it sits
with the entry points, above measure/.
"""

import json
import os
import subprocess
import sys

from tf_tput import systems
from tf_tput.measure import peak
from tf_tput.records import provenance
from tf_tput.runtime import processes
from tf_tput.runtime.topology import Topology

MODULE = "tf_tput.gemm_probe"
PROBE_TIMEOUT_S = 600  # one child probe; bfloat16 without native instructions is slow


def probe_in_child(system_name: str, environment: dict, dtype: str,
                   n: int = peak.MATMUL_PEAK_SIZE) -> float:
  """FLOP/s of the peak probe's matmul in a child process with `environment` added:
  the framework loads there as the path needs it. RuntimeError with the child's last
  words when it fails."""
  done = subprocess.run(
      [sys.executable, "-m", MODULE, system_name, dtype, str(n)],
      env={**os.environ, **environment}, capture_output=True, text=True,
      timeout=PROBE_TIMEOUT_S, preexec_fn=processes.bind_to_parent, check=False)
  lines = done.stdout.strip().splitlines()
  if done.returncode or not lines:
    tail = " | ".join((done.stderr or "").strip().splitlines()[-2:])[-300:]
    raise RuntimeError(f"exit {done.returncode}: {tail or 'no output'}")
  return float(json.loads(lines[-1])["flops"])


def main(argv) -> int:
  system_name, dtype, n = argv[1], argv[2], int(argv[3])
  runtime = systems.load(system_name).runtime
  host = Topology(runtime.name, "cpu", ("/cpu:0",), provenance.cpu_model())
  flops = peak.measure_matmul_peak(runtime.matmul_runner(host, n, dtype), n)
  print(json.dumps({"flops": flops}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
