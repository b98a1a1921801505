"""JAX multi-controller: every host is a process running the same program.

Each host is a jax.distributed process (tf_tput.runtime.processes starts them on loopback, gloo
CPU collectives) with devices_per_host XLA CPU devices; one global Mesh spans them.
The computation is a shard_map'd psum + add (tf_tput/micro/__init__.py):
  opbyop  one jitted call per computation;
  fused   one jitted lax.fori_loop of chain_length computations per call;
  chained does not exist in JAX (a program has no chain of separately dispatched
          nodes), as in the paper: recorded as not applicable.
Process 0 times the repeats and hands them back through a file. Calls are
dispatched asynchronously; every jax_host.IN_FLIGHT calls the host waits for the
last one, so only that many unfinished collective steps exist (deep queues hung
both gloo across processes and XLA:CPU within one, docs/design.md).
"""

import json
import os
import subprocess
import sys
import tempfile

from tf_tput.runtime import processes
from tf_tput.micro import Spec

MODES = ("opbyop", "fused")
GRACE_S = 5.0
run_private = None  # its hosts join on loopback (runtime.processes): no namespace needed


def unavailable():
  try:
    import jax  # noqa: F401
  except ImportError:
    return "jax is not installed: pip install -e '.[jax]'"
  return None


def host_command(spec: Spec, out_path: str, bare: bool = False) -> list:
  command = [sys.executable, "-m", "tf_tput.micro.jax_host",
             f"--spec={json.dumps(spec.__dict__)}", f"--out={out_path}"]
  return command + (["--bare"] if bare else [])


def run(spec: Spec, bare: bool = False) -> list:
  """Seconds of each timed repeat; bare=True times a plain loop of the same call."""
  with tempfile.TemporaryDirectory(prefix="tf_tput_micro_jax_") as tmp:
    out_path = os.path.join(tmp, "repeats.json")
    command = host_command(spec, out_path, bare)
    if spec.hosts == 1:
      code = _run_one(command, spec.timeout_s)
    else:
      code = processes.launch(command, spec.hosts, GRACE_S, spec.timeout_s,
                              reraise_interrupt=True)
    if code != 0 or not os.path.exists(out_path):
      raise RuntimeError(f"jax hosts failed (exit code {code}); see their output above")
    with open(out_path) as f:
      result = json.load(f)
  if result.get("error"):
    raise RuntimeError(result["error"])
  return result["repeat_seconds"]


def close() -> None:
  """Nothing outlives a run: its host processes end with it."""


def _run_one(command: list, timeout_s: float) -> int:
  proc = processes.popen(command)  # its own group; killed if this process dies
  try:
    return proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    return 124
  finally:
    processes.stop([proc], GRACE_S)
