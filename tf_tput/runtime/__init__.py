"""Where a run's devices and processes come from, and what shared code needs of a
framework to get them: one Runtime object per framework.

The modules here name no framework: device resolution per --strategy (topology), local
processes on loopback (processes), network namespaces (namespaces) joined into islands
(islands) and Cloud TPU slices (tpu). Each framework's Runtime lives in its folder,
tf_tput/systems/<framework>/runtime.py, and the systems built on that framework share
it (mtf and tf2: systems/tensorflow/runtime.py); a System names its runtime in its
`runtime` attribute, and train, launch and the peak probe ask that object, never the
framework by name:

    class Runtime(Protocol):
      name: str                 # Topology.framework; in messages only
      finds_local_tpus: bool    # --strategy=local sees a TPU host's chips itself
                                # (so --tpu_type may correct their kind)
      serves_workers: bool      # tf_tput.launch --num_workers can start its servers
      def check(self, strategy, every_worker, cluster_timeout_s) -> None
          # what the environment must hold for the strategy (TF_CONFIG, say), checked
          # before the framework starts; UsageError
      def resolve(self, num_cpu_devices=None, strategy="local", every_worker=False,
                  cluster_timeout_s=60.0, tpu_address=None) -> runtime.topology.Topology
          # every_worker: the System's (its every worker runs the program)
      def matmul_runner(self, topology, n, dtype) -> Callable[[], None]
          # one n x n matmul of ones on the first device, waited for and checked
          # (measure.peak.check_matmul_corner): the CPU peak probe
      def barrier(self, topology) -> Callable[[str], None]
          # a wait for every process of the run that runs the program
      def launch_workers(self, command, every_worker, num_workers,
                         devices_per_worker, grace_s, timeout_s, start_timeout_s,
                         ports=None, network=None, chief_env=None) -> int
          # only where serves_workers: starts the servers and the command, returns
          # the exit code (tf_tput.launch --num_workers); network: where they run, a
          # runtime.namespaces.PrivateNetwork (loopback only) or runtime.islands'
          # IslandNetwork, None for this machine's own network (--expose_servers)

A runtime with a persistent compilation cache (jax's, torch's) sets
keeps_compilation_cache (False on Runtime, which every runtime subclasses): train then
calls compilation_cache(directory) before resolve (directory None: off), and records
compilation_cache_hit() -> True (every compilation since came from the cache), False
(one at least was compiled) or None (none asked it); without it a record's
compilation_cache is null.

A runtime whose framework multiplies through more than one CPU library returns them
from gemm_paths(strategy, dtype) (default {}: no choice; measure/gemm.py), and may
name in gemm_paths_named_only (default ()) those never probed. A runtime whose
multi_worker chief drives worker servers (TF's) sets chief_drives_workers (default
False): where its system does not run on every worker, train's other processes call
serve_worker(timeout_s) -> exit code instead of training. A runtime whose framework
prints start-up notices that never say why a process failed names them in
startup_noise (default (): regular expressions matched at a line's start), which a
dead process's log tail leaves out (processes.log_tail; the suite's, of any run,
leaves out every registered runtime's). A runtime shared by systems built from more
than their framework (mtf adds mesh_tensorflow to TF) names its framework's
distributions in distributions (default {}: the system's), which key the peak store's
probes, so those systems share them.

Each runtime imports its framework only inside the methods that need it, so choosing
a system loads only its own framework.
"""

from typing import Callable, Optional, Protocol


class Runtime(Protocol):
  name: str
  finds_local_tpus: bool
  serves_workers: bool
  keeps_compilation_cache: bool = False
  gemm_paths_named_only: tuple = ()  # gemm_paths run only where named, never probed
  chief_drives_workers: bool = False  # multi_worker's other processes serve_worker
  startup_noise: tuple = ()  # its framework's start-up notices, left out of log tails
  # The record's env key -> distributions of the framework whose matmul the peak probe
  # runs: a probe the peak store keeps stands until one of their versions changes.
  # {}: the system's (System.distributions).
  distributions: dict = {}

  def compilation_cache(self, directory: Optional[str]) -> None:
    """Only where keeps_compilation_cache."""

  def compilation_cache_hit(self) -> Optional[bool]:
    return None

  def gemm_paths(self, strategy: str, dtype: str) -> dict:
    """{path name: {variable: value}}, the environment selecting each (measure/gemm.py)."""
    return {}

  def serve_worker(self, timeout_s: float) -> int:
    """Only where chief_drives_workers: serves the chief until it leaves; exit code."""
    raise NotImplementedError(f"the {self.name} runtime drives no worker servers")

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None: ...

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None): ...

  def matmul_runner(self, topology, n: int, dtype: str) -> Callable[[], None]: ...

  def barrier(self, topology) -> Callable[[str], None]: ...

  def launch_workers(self, command, every_worker: bool, num_workers: int,
                     devices_per_worker: int, grace_s: float, timeout_s, start_timeout_s,
                     ports=None, network=None, chief_env=None) -> int: ...
