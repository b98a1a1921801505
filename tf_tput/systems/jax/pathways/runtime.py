"""Pathways on Cloud's runtime (tf_tput.runtime.Runtime), for --system=pathways:
this process is the single JAX client of a Pathways cluster, talking to its IFRT
proxy; jax.devices() are then every TPU chip of the cluster, all "local" to this one
process (jax.process_count() is 1).

It is set up as Pathways on Cloud documents for a client outside the cluster
(cloud.google.com/ai-hypercomputer/docs/workloads/pathways-on-cloud, "interactive
mode"; the same for a batch workload's container):

    export JAX_PLATFORMS=proxy
    export JAX_BACKEND_TARGET=grpc://127.0.0.1:29000   # e.g. after kubectl port-forward
    ... import pathwaysutils; pathwaysutils.initialize() before JAX's first device use

JAX_BACKEND_TARGET is required and checked before JAX starts; JAX_PLATFORMS may be
unset (this runtime selects the proxy platform) or proxy. pathwaysutils registers
the proxy backend; its client blocks until the proxy answers, so the first device
query runs on a daemon thread bounded by --cluster_timeout_s (as
jax/runtime.py's join_processes bounds jax.distributed).

Never run against a Pathways cluster by tf_tput's tests: they reach the connection
only (a loopback port where no proxy answers).
"""

import importlib.util
import math
import os
import re
import threading
from typing import Optional

from absl import logging

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime.topology import Topology
from tf_tput.systems.jax import runtime as jax_runtime
from tf_tput import runtime as runtime_lib

BACKEND_TARGET_ENV = "JAX_BACKEND_TARGET"
PLATFORMS_ENV = "JAX_PLATFORMS"
PROXY_PLATFORM = "proxy"
# pathwaysutils' proxy backend gives up connecting after this many seconds (its own
# variable; a value the user set is kept); unset, it waits as long as the proxy is
# silent.
CONNECTION_TIMEOUT_ENV = "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS"
EXAMPLE_TARGET = "grpc://127.0.0.1:29000"  # the proxy's port, forwarded as documented
TARGET_FORM = re.compile(r"grpc://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}")
INSTALL = 'pip install -e ".[pathways]"'
PACKAGES = ("jax", "pathwaysutils")  # module names, as the extra installs them
NEVER_RUN = ("--system=pathways has never run against a Pathways cluster in tf_tput's "
             "own tests (docs/systems.md); check its record against --system=jax")


def check_installed() -> None:
  """The packages the pathways extra installs, looked for without importing them."""
  missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
  if missing:
    raise UsageError(f"--system=pathways needs {' and '.join(missing)}, not installed; "
                     f"install the extra: {INSTALL}")


def backend_target(environ=os.environ) -> str:
  """The proxy's address from JAX_BACKEND_TARGET, checked with JAX_PLATFORMS."""
  target = environ.get(BACKEND_TARGET_ENV, "")
  fix = (f"point it at the Pathways cluster's IFRT proxy, e.g. {BACKEND_TARGET_ENV}="
         f"{EXAMPLE_TARGET} after kubectl port-forward of its pathways-head pod "
         "(docs/systems.md)")
  if not target:
    raise UsageError(f"--system=pathways: {BACKEND_TARGET_ENV} is not set; {fix}")
  if not TARGET_FORM.fullmatch(target):
    raise UsageError(f"{BACKEND_TARGET_ENV}={target} is not grpc://HOST:PORT; {fix}")
  platforms = environ.get(PLATFORMS_ENV, "")
  if platforms not in ("", PROXY_PLATFORM):
    raise UsageError(f"{PLATFORMS_ENV}={platforms}: --system=pathways runs JAX on the "
                     f"Pathways proxy; set {PLATFORMS_ENV}={PROXY_PLATFORM} or unset it")
  return target


def connect(jax, target: str, timeout_s: float) -> list:
  """jax.devices() through the proxy at `target`, failing after timeout_s with a
  TimeoutError that names the address, the variable and the flag. The proxy client
  blocks until the proxy answers (or its own connection timeout), in code no Python
  interrupts, so the query runs on a daemon thread that this thread stops waiting for."""
  outcome = {}

  def devices():
    try:
      outcome["devices"] = jax.devices()
    except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
      outcome["error"] = e

  fix = (f"start the Pathways cluster and its proxy and point {BACKEND_TARGET_ENV} at it "
         "(docs/systems.md), or raise --cluster_timeout_s")
  querying = threading.Thread(target=devices, name="pathways-proxy-connect", daemon=True)
  querying.start()
  querying.join(timeout_s)
  if querying.is_alive():
    raise TimeoutError(f"no Pathways proxy answered at {target} ({BACKEND_TARGET_ENV}) "
                       f"within --cluster_timeout_s={timeout_s:g}; {fix}")
  if "error" in outcome:
    error = outcome["error"]
    raise ConnectionError(f"no Pathways proxy answered at {target} ({BACKEND_TARGET_ENV}): "
                          f"{' '.join(str(error).split())}; {fix}") from error
  return outcome["devices"]


class PathwaysRuntime(runtime_lib.Runtime):
  """JAX with the Pathways proxy as its backend: the peak probe's matmul and the
  (one-process) barrier are JAX's runtime's; devices come from the cluster. Not a
  subclass: what else JAX's runtime keeps on this host (its persistent compilation
  cache) Pathways does on the cluster (pathwaysutils.initialize turns JAX's off)."""
  name = "pathways"
  finds_local_tpus = True  # the cluster's chips, seen as this process's own
  serves_workers = False

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None:
    """The extra installed and the proxy's address given, before JAX starts."""
    check_installed()
    backend_target()

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    if num_cpu_devices:
      raise UsageError(f"--num_cpu_devices={num_cpu_devices}: --system=pathways trains "
                       f"on the Pathways cluster's devices ({BACKEND_TARGET_ENV}); drop "
                       "the flag")
    target = backend_target()
    logging.warning(NEVER_RUN)
    import jax
    import pathwaysutils

    jax.config.update("jax_platforms", PROXY_PLATFORM)
    jax.config.update("jax_backend_target", target)
    # Its client gives up well after this runtime stops waiting (connect()): a client
    # failing while the process exits aborts it, a client still waiting does not.
    os.environ.setdefault(CONNECTION_TIMEOUT_ENV, str(
        math.ceil(cluster_timeout_s) + jax_runtime.ABORT_MARGIN_S))
    pathwaysutils.initialize()  # registers the proxy backend (JAX_PLATFORMS=proxy)
    devices = connect(jax, target, cluster_timeout_s)
    # The client's node only: the proxy presents every chip of the cluster as this one
    # process's (jax.process_count() is 1), so JAX's devices name no TPU host behind
    # it (expected, not seen: NEVER_RUN).
    return Topology(self.name, devices[0].platform, tuple(str(d) for d in devices),
                    devices[0].device_kind, num_processes=jax.process_count(),
                    strategy="local", shares_host_cpu=False,
                    nodes=(provenance.this_node(),))

  def matmul_runner(self, topology, n: int, dtype: str):
    return jax_runtime.RUNTIME.matmul_runner(topology, n, dtype)

  def barrier(self, topology):
    return jax_runtime.RUNTIME.barrier(topology)  # one process: waits for none

  def launch_workers(self, *args, **kwargs) -> int:
    raise UsageError("Pathways has no worker servers to start here: its workers are the "
                     "Pathways cluster's; run tf_tput.train --system=pathways alone, "
                     f"with {BACKEND_TARGET_ENV} naming the cluster's proxy")


RUNTIME = PathwaysRuntime()
