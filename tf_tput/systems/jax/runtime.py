"""JAX's runtime (tf_tput.runtime.Runtime): devices, the peak probe's matmul and
the barrier, for every system built on JAX.

Devices: `--num_cpu_devices=N` splits the host CPU into N virtual devices (they share
its cores); otherwise JAX's own (GPUs, a TPU host's chips, else the CPU). A process
one of several a launcher started (runtime/launchers.py: tf_tput.launch, torchrun,
srun, mpirun) joins the others through jax.distributed (JAX's own cluster detection
for Slurm and Open MPI, else the launcher's coordinator; gloo CPU collectives;
strategy "multi_process"); its num_cpu_devices are then per process. Where no
launcher started it, JAX's own detection may still find a Cloud TPU pod or a
Kubernetes job (never exercised here).

Compilation cache: JAX's persistent cache, under a directory train names (on by
default), in a subdirectory per JAX version and host CPU model (below).
"""

import math
import os
import threading
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import topology as topology_lib
from tf_tput.runtime.topology import Topology
from tf_tput import runtime as runtime_lib


# After --cluster_timeout_s the run fails here, in Python; JAX's own deadline comes this
# much later: when it passes, JAX ends the process (a fatal log line, SIGABRT), with no
# record, so the process must be gone by then.
ABORT_MARGIN_S = 60


# Launchers whose processes JAX's own cluster detection finds (jax/_src/clusters/):
# launcher -> its cluster_detection_method.
JAX_DETECTS = {"slurm": "slurm", "mpirun": "ompi"}


def join_processes(jax, launch, timeout_s: float) -> None:
  """jax.distributed.initialize for this process's launch (runtime/launchers.py):
  JAX's own cluster detection where JAX has one for the launcher (Slurm, Open MPI),
  else the launcher's coordinator, served on its address only; failing after
  timeout_s with a TimeoutError that names the coordinator and the flag. JAX waits for
  every process to register with the coordinator (process 0 serves it) up to its
  initialization_timeout and then aborts the process, which no Python code outlives;
  so the call runs on a daemon thread and this thread stops waiting for it first. A
  process that gives up exits soon after (its record written), well before JAX's
  later deadline."""
  outcome = {}
  coordinator, process_id = launch.coordinator, launch.process_id
  num_processes = launch.num_processes
  detection = JAX_DETECTS.get(launch.launcher)
  where = ({"cluster_detection_method": detection} if detection else
           {"coordinator_address": coordinator, "coordinator_bind_address": coordinator,
            "num_processes": num_processes, "process_id": process_id})

  def initialize():
    try:
      jax.distributed.initialize(
          **where, initialization_timeout=math.ceil(timeout_s) + ABORT_MARGIN_S)
    except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
      outcome["error"] = e

  joining = threading.Thread(target=initialize, name="jax-distributed-initialize",
                             daemon=True)
  joining.start()
  joining.join(timeout_s)
  if joining.is_alive():
    raise TimeoutError(f"process {process_id}: the JAX coordinator at "
                       f"{coordinator or 'the address ' + detection + ' gives'} did "
                       f"not gather all {num_processes} processes within "
                       f"--cluster_timeout_s={timeout_s:g}; start them all (python -m "
                       "tf_tput.launch --num_processes=N does) or raise the timeout")
  if "error" in outcome:
    raise outcome["error"]


def _cluster_found_by_jax() -> bool:
  """Whether JAX's own detection finds a cluster no launcher of launchers.py started:
  a Cloud TPU pod's workers, a Kubernetes job (jax/_src/clusters/). NOT exercised
  here: no TPU pod or Kubernetes."""
  try:
    from jax._src import clusters
    return any(env.is_env_present() for env in clusters.ClusterEnv._cluster_types
               if not env.opt_in_only_method and env.name not in JAX_DETECTS.values())
  except Exception:  # noqa: BLE001 - JAX's private module moved; no cluster then
    return False


def initialize_found_cluster(jax, timeout_s: float) -> None:
  """jax.distributed.initialize() with no argument: JAX's detection gives every one."""
  jax.distributed.initialize(initialization_timeout=math.ceil(timeout_s) + ABORT_MARGIN_S)


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
  except Exception as e:  # noqa: BLE001 - XLA's runtime error, its status in the text
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


class JaxRuntime(runtime_lib.Runtime):
  keeps_compilation_cache = True
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
      import filelock  # noqa: F401 - JAX locks and evicts with it (the jax extra's)
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
    launch = topology_lib.launched()
    if launch.num_processes > 1 and not (launch.coordinator
                                         or launch.launcher in JAX_DETECTS):
      raise UsageError(f"{launch.launcher} started {launch.num_processes} processes but "
                       "names no coordinator JAX's processes could meet at; start them "
                       "with tf_tput.launch, torchrun, srun or mpirun")

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    import jax

    launch = topology_lib.launched()
    num_processes, process_id = launch.num_processes, launch.process_id
    if num_cpu_devices:
      jax.config.update("jax_platforms", "cpu")
      jax.config.update("jax_num_cpu_devices", num_cpu_devices)
    if num_processes > 1:
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
      join_processes(jax, launch, cluster_timeout_s)
    elif launch.launcher is None and not num_cpu_devices and _cluster_found_by_jax():
      initialize_found_cluster(jax, cluster_timeout_s)
      num_processes, process_id = jax.process_count(), jax.process_index()
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
