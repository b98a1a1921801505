"""Ray's runtime (tf_tput.runtime.Runtime): a single controller's devices, the
Ray actors, for --system=ray.

Devices: one per actor. `--num_cpu_devices=N` gives N CPU actors; without it, one
actor per GPU the driver's torch sees, else one CPU actor. The actors are created by
the trainer (trainer.py); resolve() connects this process to the
cluster they run on:
  - by default a private Ray cluster on loopback, started here (its logical CPUs: one
    per actor), as the Ray micro-benchmark starts one (cluster.py, shared
    with it);
  - with RAY_ADDRESS set in the environment (Ray's own variable: an address such as
    10.0.0.2:6379, or `auto`), the existing cluster there, joined: where a run goes
    past one machine. Exercised on a two-node cluster of this machine, each node in
    a network namespace of its own (`ray start`, nodes.py), never across machines.
tf_tput.launch --num_workers=N starts such a cluster of N nodes itself (one per
island under --islands) and runs the command as its driver (launch_workers).
The cluster is stopped when the trainer closes, and at the latest when this process
exits (atexit), with every process it started.

The peak probe's matmul is torch's (systems/torch/runtime.py), run in the driver
on this host's CPU: the actors of a private cluster share those cores (a joined
cluster's may run elsewhere; its CPU peak is still this host's). There is one
controller: the barrier waits for nobody, and there are no worker servers to launch.
"""

import atexit
import importlib.util
import os
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import topology as topology_lib
from tf_tput.runtime.topology import Topology
from tf_tput.systems.torch.ray import auth
from tf_tput import runtime as runtime_lib

ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own variable: join the cluster there
DEVICE_PREFIX = "ray-actor"  # devices are named ray-actor:0, ray-actor:1, ...

_clusters = []  # every cluster this process started or joined, stopped at exit


def _stop_clusters() -> None:
  while _clusters:
    _clusters.pop().stop()


class RayRuntime(runtime_lib.Runtime):
  name = "ray"
  finds_local_tpus = False
  serves_workers = True    # tf_tput.launch --num_workers starts Ray nodes (nodes.py)

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None:
    """The ray extra must be installed, and a cluster's token given as Ray sends it
    (auth.py); checked before anything starts."""
    missing = [m for m in ("ray", "torch") if importlib.util.find_spec(m) is None]
    if missing:
      raise UsageError(f"--system=ray needs {' and '.join(missing)}, not installed: "
                       "pip install -e '.[ray]'")
    auth.check_env()  # joining a cluster: its token, as Ray will (not) send it

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    from tf_tput.systems.torch.ray import cluster as ray_cluster
    if topology_lib.launched_processes()[0] > 1:
      raise UsageError("--system=ray is a single controller: run it as one process, not "
                       "under tf_tput.launch --num_processes")
    platform, count, kind = "cpu", num_cpu_devices or 1, provenance.cpu_model()
    if not num_cpu_devices:
      import torch
      if torch.cuda.is_available():
        platform, count = "gpu", torch.cuda.device_count()
        kind = torch.cuda.get_device_name(0)
    cluster = ray_cluster.Cluster(num_cpus=count,
                                  address=os.environ.get(ADDRESS_ENV) or None)
    if not _clusters:
      atexit.register(_stop_clusters)  # after ray's own atexit (registered at import)
    _clusters.append(cluster)
    cluster.start()
    _check_room(cluster, platform, count)
    return Topology("ray", platform,
                    tuple(f"{DEVICE_PREFIX}:{i}" for i in range(count)), kind,
                    num_processes=1, strategy="local",
                    islands=topology_lib.launched_islands(),
                    handles={"cluster": cluster, "timeout_s": cluster_timeout_s})

  def matmul_runner(self, topology, n: int, dtype: str):
    """torch's probe, in the driver on this host's CPU (every core: the actors wait)."""
    from tf_tput.systems.torch import runtime as torch_runtime
    return torch_runtime.RUNTIME.matmul_runner(topology, n, dtype)

  def barrier(self, topology):
    """One controller: nobody to wait for."""
    return lambda name: None

  def launch_workers(self, command, every_worker: bool, num_workers: int,
                     devices_per_worker: int, grace_s: float, timeout_s, start_timeout_s,
                     ports=None, network=None, chief_env=None) -> int:
    """tf_tput.launch --num_workers=N: N Ray nodes of devices_per_worker CPUs each,
    started with `ray start` (nodes.py), the command their driver."""
    from tf_tput.systems.torch.ray import nodes
    del every_worker  # one driver
    return nodes.launch(command, num_workers, devices_per_worker, grace_s, timeout_s,
                        start_timeout_s, ports, network, chief_env)


def _check_room(cluster, platform: str, count: int) -> None:
  """A joined cluster must hold one CPU (and on GPUs one GPU) per actor."""
  import ray
  resources = ray.cluster_resources()
  needed = {"CPU": count, **({"GPU": count} if platform == "gpu" else {})}
  short = {k: v for k, v in needed.items() if resources.get(k, 0) < v}
  if short:
    cluster.stop()
    raise UsageError(f"the Ray cluster at {cluster.address} has "
                     + ", ".join(f"{resources.get(k, 0):g} {k}" for k in short)
                     + f"; {count} actor(s) need "
                     + ", ".join(f"{v} {k}" for k, v in short.items())
                     + ": pass a smaller --num_cpu_devices or add nodes")


RUNTIME = RayRuntime()
