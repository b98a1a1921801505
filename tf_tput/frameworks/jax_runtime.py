"""JAX's runtime (tf_tput/frameworks/__init__.py): devices, the peak probe's matmul and
the barrier, for every system built on JAX.

Devices: `--num_cpu_devices=N` splits the host CPU into N virtual devices (they share
its cores); otherwise JAX's own (GPUs, a TPU host's chips, else the CPU). A process
started by `tf_tput.launch --num_processes` joins the others through
jax.distributed (the launcher's coordinator, gloo CPU collectives; strategy
"multi_process"); its num_cpu_devices are then per process.
"""

import os
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import processes, topology as topology_lib
from tf_tput.runtime.topology import Topology


class JaxRuntime:
  name = "jax"
  finds_local_tpus = True  # on a TPU VM, jax.devices() are its chips
  serves_workers = False   # processes come from tf_tput.launch --num_processes

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
      jax.distributed.initialize(coordinator_address=coordinator,
                                 coordinator_bind_address=coordinator,
                                 num_processes=num_processes, process_id=process_id)
    devices = jax.devices()
    platform = devices[0].platform
    kind = provenance.cpu_model() if platform == "cpu" else devices[0].device_kind
    return Topology("jax", platform, tuple(str(d) for d in devices), kind,
                    num_processes=jax.process_count(),
                    strategy="multi_process" if num_processes > 1 else "local",
                    islands=topology_lib.launched_islands())

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
