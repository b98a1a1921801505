"""The peak probe's matmul in a process of its own, for gemm.py: one GEMM path.

    python -m tf_tput.measure.gemm_probe SYSTEM DTYPE N

The parent sets the path's environment; this process loads the system's framework
under it, runs the probe on the host CPU with every core, and prints one JSON line,
{"flops": ...}. Internal: started by gemm.probe_in_child, never by a user.
"""

import json
import sys

from tf_tput import systems
from tf_tput.measure import peak
from tf_tput.records import provenance
from tf_tput.runtime.topology import Topology


def main(argv) -> int:
  system_name, dtype, n = argv[1], argv[2], int(argv[3])
  runtime = systems.load(system_name).runtime
  host = Topology(runtime.name, "cpu", ("/cpu:0",), provenance.cpu_model())
  flops = peak.measure_matmul_peak(runtime.matmul_runner(host, n, dtype), n)
  print(json.dumps({"flops": flops}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
