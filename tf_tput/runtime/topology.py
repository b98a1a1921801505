"""Which devices a run uses: the Topology a system's framework runtime resolves
(tf_tput/systems/<framework>/runtime.py) once, before any model is built, and what
what the process's launcher told it (launchers.py). Strategies (--strategy; a System lists those it runs under):
  local         this process's devices: `--num_cpu_devices=N` virtual CPU devices
                (they share the host's cores), else the accelerators the framework
                finds, else the CPU; under a launcher of several processes
                (tf_tput.launch --num_processes, torchrun, srun, mpirun) each
                process's, joined into one run ("multi_process").
  multi_worker  the worker servers of a cluster (`tf_tput.launch --num_workers`, a
                TF_CONFIG, the tasks of a Slurm job step).
  tpu           a Cloud TPU named by --tpu.
"""

import dataclasses
import os

from tf_tput.runtime import islands, launchers

STRATEGIES = ("local", "multi_worker", "tpu")


@dataclasses.dataclass(frozen=True)
class Topology:
  framework: str             # the runtime's name (tf_tput.runtime.Runtime)
  platform: str              # "cpu" | "gpu"
  devices: tuple             # framework device names, in mesh order
  device_kind: str           # e.g. "NVIDIA H100 80GB HBM3", or the CPU model
  num_processes: int = 1
  strategy: str = "local"    # "local" | "multi_process" | "multi_worker" | "tpu"
  session_target: str = ""   # "" runs in this process; grpc://... a cluster's master
  workers: tuple = ()        # multi_worker: the workers (index, address, task,
                             # devices), devices listed
  shares_host_cpu: bool = True  # every device runs on this host's CPU cores
  islands: int = 0           # tf_tput.launch --islands=K (0: none): an island mesh axis
  # The distinct nodes its workers (the processes holding its devices) run on, sorted:
  # provenance.this_node() of each process, or what the runtime can tell of a remote
  # one (a TF worker's host); () where the runtime cannot tell before the trainer
  # places its workers (the trainer's optional `nodes` then says, systems/__init__.py).
  nodes: tuple = ()
  # Objects the run needs alive: a chief's server, a strategy, TPU handles.
  handles: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  def describe(self) -> list:
    """The `accelerators` entry of a record's env: per worker in a cluster."""
    if self.workers:
      return [{"platform": self.platform, "kind": self.device_kind,
               "count": len(w.devices), "task": w.task, "address": w.address}
              for w in self.workers]
    return [{"platform": self.platform, "kind": self.device_kind,
             "count": self.num_devices}]


def launched() -> launchers.Launch:
  """Who started this process (runtime/launchers.py): its launcher, rank, world size."""
  return launchers.detect(os.environ)


def launched_processes() -> tuple:
  """(number of processes, this process's index) as its launcher set them; (1, 0) alone."""
  launch = launched()
  return launch.num_processes, launch.process_id


def launched_islands() -> int:
  """How many islands tf_tput.launch --islands split the processes into (1: one
  island, its processes on loopback, still with an island axis); 0 without --islands."""
  return int(os.environ.get(islands.NUM_ISLANDS_ENV, "0"))
