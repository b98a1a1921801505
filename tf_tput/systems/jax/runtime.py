"""JAX's runtime (tf_tput.runtime.Runtime): devices, the peak probe's matmul and
the barrier, for every system built on JAX.

Devices: `--num_cpu_devices=N` splits the host CPU into N virtual devices (they share
its cores); otherwise JAX's own (GPUs, a TPU host's chips, else the CPU). A process
started by `tf_tput.launch --num_processes` joins the others through
jax.distributed (the launcher's coordinator, gloo CPU collectives; strategy
"multi_process"); its num_cpu_devices are then per process.

Compilation cache: JAX's persistent cache, under a directory train names (on by
default), in a subdirectory per JAX version and host CPU model (below).
"""

import math
import os
import threading
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import processes, topology as topology_lib
from tf_tput.runtime.topology import Topology


# After --cluster_timeout_s the run fails here, in Python; JAX's own deadline comes this
# much later: when it passes, JAX ends the process (a fatal log line, SIGABRT), with no
# record, so the process must be gone by then.
ABORT_MARGIN_S = 60


def join_processes(jax, coordinator: str, num_processes: int, process_id: int,
                   timeout_s: float) -> None:
  """jax.distributed.initialize, failing after timeout_s with a TimeoutError that names
  the coordinator and the flag. JAX waits for every process to register with the
  coordinator (process 0 serves it) up to its initialization_timeout and then aborts
  the process, which no Python code outlives; so the call runs on a daemon thread and
  this thread stops waiting for it first. A process that gives up exits soon after
  (its record written), well before JAX's later deadline."""
  outcome = {}

  def initialize():
    try:
      jax.distributed.initialize(
          coordinator_address=coordinator, coordinator_bind_address=coordinator,
          num_processes=num_processes, process_id=process_id,
          initialization_timeout=math.ceil(timeout_s) + ABORT_MARGIN_S)
    except BaseException as e:  # noqa: BLE001: raised again in the caller's thread
      outcome["error"] = e

  joining = threading.Thread(target=initialize, name="jax-distributed-initialize",
                             daemon=True)
  joining.start()
  joining.join(timeout_s)
  if joining.is_alive():
    raise TimeoutError(f"process {process_id}: the JAX coordinator at {coordinator} did "
                       f"not gather all {num_processes} processes within "
                       f"--cluster_timeout_s={timeout_s:g}; start them all (python -m "
                       "tf_tput.launch --num_processes=N does) or raise the timeout")
  if "error" in outcome:
    raise outcome["error"]


NODE_KEY = "tf_tput/node/"  # + process id: each process's node in the key-value store


def gather_nodes(num_processes: int, process_id: int, timeout_s: float) -> tuple:
  """Every joined process's node (provenance.this_node), distinct and sorted, through
  jax.distributed's key-value store (the coordinator's), so that process 0, which
  writes the record, knows them all. Each waits at most timeout_s for the others'."""
  from jax._src import distributed  # its client: jax.distributed exports none
  client = distributed.global_state.client
  client.key_value_set(f"{NODE_KEY}{process_id}", provenance.this_node(),
                       allow_overwrite=True)  # a process that resolves again
  try:
    nodes = {client.blocking_key_value_get(f"{NODE_KEY}{i}", int(timeout_s * 1000))
             for i in range(num_processes)}
  except Exception as e:  # noqa: BLE001: XLA's runtime error, its status in the text
    if "DEADLINE_EXCEEDED" not in str(e):
      raise
    raise TimeoutError(f"process {process_id}: not every process told its node through "
                       f"the JAX coordinator within --cluster_timeout_s={timeout_s:g}; "
                       "one of them failed first (its log says why)") from None
  return tuple(sorted(nodes))


# JAX's monitoring events: every compilation that asks the persistent cache, and
# those it answers (jax/_src/compiler.py, compile_or_get_cached). A miss is a request
# without a hit (JAX's cache_misses event counts only entries written).
CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# The cache's bound; with filelock (the jax extra's) JAX evicts the least recently
# used entries beyond it and locks each read and write, so the processes of a launch
# (or two runs) never read an entry another is still writing.
CACHE_MAX_BYTES = 8 * 2 ** 30


def cache_subdirectory(jax_version: str, cpu_model: str, cpu_flags: set) -> str:
  """Where under the cache directory this JAX keeps its entries. JAX's key covers the
  computation, compile options, XLA flags, jaxlib and the platform's name and version,
  but an XLA:CPU platform's version is just "cpu", hence one subdirectory per JAX
  version and host CPU (provenance.host_cache_subdirectory)."""
  return provenance.host_cache_subdirectory(f"jax-{jax_version}", cpu_model, cpu_flags)


class JaxRuntime:
  name = "jax"
  finds_local_tpus = True  # on a TPU VM, jax.devices() are its chips
  serves_workers = False   # processes come from tf_tput.launch --num_processes

  def __init__(self):
    self._cache_events = None  # event -> count since compilation_cache(); None: never
    self._lock = threading.Lock()

  def compilation_cache(self, directory: Optional[str]) -> None:
    """Keeps compiled executables under `directory` (None: no persistent cache), every
    one however quick to compile, and counts this process's requests and hits from
    here on (compilation_cache_hit). Before any compilation (resolve, the peak probe)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache
    jax_cache.reset_cache()  # a process that compiled before keeps no other directory
    if directory is None:
      jax.config.update("jax_enable_compilation_cache", False)
      jax.config.update("jax_compilation_cache_dir", None)
    else:
      path = os.path.join(directory, cache_subdirectory(
          jax.__version__, provenance.cpu_model(), provenance.cpu_flags()))
      os.makedirs(path, exist_ok=True)
      jax.config.update("jax_enable_compilation_cache", True)
      jax.config.update("jax_compilation_cache_dir", path)
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # every size
      import filelock  # noqa: F401: JAX locks and evicts with it (the jax extra's)
      jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    with self._lock:
      first = self._cache_events is None
      self._cache_events = {CACHE_REQUEST_EVENT: 0, CACHE_HIT_EVENT: 0}
    if first:
      jax.monitoring.register_event_listener(self._count_cache_event)

  def _count_cache_event(self, event: str, **kwargs) -> None:
    with self._lock:
      if event in self._cache_events:
        self._cache_events[event] += 1

  def compilation_cache_hit(self) -> Optional[bool]:
    """True when every compilation since compilation_cache() came from the cache,
    False when one at least was compiled, None when none asked it (off, never set,
    or a backend JAX cannot serialize executables of)."""
    if not self._cache_events or not self._cache_events[CACHE_REQUEST_EVENT]:
      return None
    return self._cache_events[CACHE_HIT_EVENT] == self._cache_events[CACHE_REQUEST_EVENT]

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None:
    """Nothing in the environment to check: the launcher's variables are its own."""

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    import jax

    num_processes, process_id = topology_lib.launched_processes()
    if num_cpu_devices:
      jax.config.update("jax_platforms", "cpu")
      jax.config.update("jax_num_cpu_devices", num_cpu_devices)
    if num_processes > 1:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
      # 127.0.0.1:port, or island 0's address inside the islands tf_tput.launch made
      coordinator = os.environ[processes.COORDINATOR_ENV]
      join_processes(jax, coordinator, num_processes, process_id, cluster_timeout_s)
    devices = jax.devices()
    platform = devices[0].platform
    kind = provenance.cpu_model() if platform == "cpu" else devices[0].device_kind
    nodes = ((provenance.this_node(),) if num_processes == 1 else
             gather_nodes(num_processes, process_id, cluster_timeout_s))
    return Topology("jax", platform, tuple(str(d) for d in devices), kind,
                    num_processes=jax.process_count(),
                    strategy="multi_process" if num_processes > 1 else "local",
                    islands=topology_lib.launched_islands(), nodes=nodes)

  def matmul_runner(self, topology, n: int, dtype: str):
    import jax
    import jax.numpy as jnp
    from tf_tput.measure import peak
    where = f"jax {dtype} peak probe"
    device = jax.local_devices()[0]
    a = jax.device_put(jnp.ones((n, n), dtype=dtype), device)
    corner = jax.jit(lambda a: jnp.matmul(a, a)[0, 0])  # the whole product is computed
    return lambda: peak.check_matmul_corner(corner(a), n, where)  # reading a value waits

  def barrier(self, topology):
    """Every launched process meets at JAX's global sync; one process waits for none."""
    if topology.num_processes == 1:
      return lambda name: None
    from jax.experimental import multihost_utils
    return multihost_utils.sync_global_devices

  def launch_workers(self, *args, **kwargs) -> int:
    raise UsageError("JAX has no worker servers to start; launch its processes with "
                     "tf_tput.launch --num_processes=N")


RUNTIME = JaxRuntime()
