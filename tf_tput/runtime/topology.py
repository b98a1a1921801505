"""Which devices a run uses, per framework, and how fast their matmuls are.

Resolution happens once, before any model is built. Strategies:
  local         `--num_cpu_devices=N` splits the host CPU into N virtual devices (they
                share its cores); otherwise GPUs are used when present, else the one
                CPU device. A JAX process started by `tf_tput.launch --num_processes`
                joins the others through jax.distributed (loopback coordinator, gloo
                CPU collectives; strategy "multi_process"); its `num_cpu_devices` are
                then per process.
  multi_worker  TF only: this process is the chief of the TF_CONFIG cluster and its
                devices are every worker's (tf_tput.runtime.cluster).
  tpu           TF only: a Cloud TPU through TPUClusterResolver (tf_tput.runtime.tpu).
"""

import dataclasses
import os
from typing import Optional

from tf_tput.records import provenance
from tf_tput.runtime import cluster, islands, processes
from tf_tput.errors import UsageError

STRATEGIES = ("local", "multi_worker", "tpu")


@dataclasses.dataclass(frozen=True)
class Topology:
  framework: str             # "tf" | "jax"
  platform: str              # "cpu" | "gpu"
  devices: tuple             # framework device names, in mesh order
  device_kind: str           # e.g. "NVIDIA H100 80GB HBM3", or the CPU model
  num_processes: int = 1
  strategy: str = "local"    # "local" | "multi_process" | "multi_worker" | "tpu"
  session_target: str = ""   # TF: "" runs in this process; grpc://... a cluster's master
  workers: tuple = ()        # multi_worker: cluster.Worker entries, devices listed
  shares_host_cpu: bool = True  # every device runs on this host's CPU cores
  islands: int = 0           # tf_tput.launch --islands=K (0: none): an island mesh axis
  # Objects the run needs alive: the chief's tf.distribute.Server, TPU handles.
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


def launched_processes() -> tuple:
  """(number of processes, this process's index) as tf_tput.launch set them; (1, 0) alone."""
  return (int(os.environ.get(processes.NUM_PROCESSES_ENV, "1")),
          int(os.environ.get(processes.PROCESS_ID_ENV, "0")))


def launched_islands() -> int:
  """How many islands tf_tput.launch --islands split the processes into (1: one
  island, its processes on loopback, still with an island axis); 0 without --islands."""
  return int(os.environ.get(islands.NUM_ISLANDS_ENV, "0"))


def check_strategy(system: str, strategy: str, experiment,
                   num_cpu_devices: Optional[int] = None) -> None:
  """What --strategy asks of the system and the config, checked the same way by
  tf_tput.train and a suite's validation (the environment's part stays in train)."""
  from tf_tput import systems
  allowed = systems.load(system).strategies
  if strategy not in allowed:
    raise UsageError(f"--strategy={strategy} is not one --system={system} runs under; "
                     f"it runs under {', '.join(allowed)}" + (
                         " (processes come from tf_tput.launch --num_processes)"
                         if allowed == ("local",) else ""))
  if system == "tf2":  # strategies replicate: a data-parallel mesh only (no TF needed)
    from tf_tput.systems import tf2
    tf2.check_mesh(experiment)
  if strategy != "local" and num_cpu_devices is not None:
    raise UsageError(f"--num_cpu_devices applies to --strategy=local; with {strategy} the "
                     "devices come from the cluster (tf_tput.launch --devices_per_worker)")
  if strategy == "tpu" and experiment.model.activation_dtype != "bfloat16":
    raise UsageError(f"--strategy=tpu trains in bfloat16 activations (the MXU's type), "
                     f"not {experiment.model.activation_dtype}; add "
                     "--gin_param=\"ModelConfig.activation_dtype='bfloat16'\"")
  if strategy == "tpu" and experiment.pipelined:  # mtf's TPU program is one SIMD mesh
    raise UsageError(f"--strategy=tpu (mtf's SIMD mesh) does not pipeline; PipelineConfig"
                     f".stages = {experiment.pipeline.stages} runs under --system=mtf on "
                     "CPUs/GPUs (one Session) or under --system=jax on TPUs")


def resolve(framework: str, num_cpu_devices: Optional[int], strategy: str = "local",
            cluster_timeout_s: float = 60.0, tpu_address=None,
            every_worker: bool = False) -> Topology:
  if strategy == "multi_worker":
    return _resolve_tf_workers() if every_worker else _resolve_tf_cluster(cluster_timeout_s)
  if strategy == "tpu":
    return _resolve_tpu_strategy(tpu_address) if every_worker else _resolve_tpu(tpu_address)
  if framework == "tf":
    return _resolve_tf(num_cpu_devices)
  if framework == "jax":
    return _resolve_jax(num_cpu_devices)
  raise UsageError(f"no topology resolver for framework {framework!r}")


def _resolve_tf_cluster(cluster_timeout_s: float) -> Topology:
  """Joins the TF_CONFIG cluster as its chief; the mesh spans every worker's devices."""
  chief, workers = cluster.parse_tf_config(os.environ.get(cluster.ENV, ""))
  cluster.check_port_free(chief)
  cluster.wait_for_workers(workers, cluster_timeout_s)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                task_index=resolver.task_id, start=True)
  # CreateSession and ListDevices wait for every worker; bound that wait.
  config = tf.compat.v1.ConfigProto(
      operation_timeout_in_ms=int(cluster_timeout_s * 1000))
  with tf.compat.v1.Session(server.target, config=config) as session:
    listed = [d.name for d in session.list_devices()]
  workers = cluster.with_devices(workers, listed)
  devices = tuple(d for w in workers for d in w.devices)
  gpu = "/device:GPU:" in devices[0]
  loopback = all(_on_this_host(w.address) for w in workers)
  kind = ("GPU" if gpu else provenance.cpu_model() if loopback else "remote host CPU")
  return Topology("tf", "gpu" if gpu else "cpu", devices, kind,
                  num_processes=len(workers), strategy="multi_worker",
                  session_target=server.target, workers=tuple(workers),
                  shares_host_cpu=loopback and not gpu, handles={"server": server},
                  islands=launched_islands())


def _on_this_host(address: str) -> bool:
  """Loopback, or inside the islands tf_tput.launch made here (network namespaces of
  this host, on 198.18.0.0/15)."""
  if address.startswith(("127.", "localhost:", "[::1]")):
    return True
  import ipaddress
  host = address.rsplit(":", 1)[0]
  try:
    return launched_islands() > 0 and ipaddress.ip_address(host) in islands.ADDRESS_BLOCK
  except ValueError:
    return False


def _resolve_tf_workers() -> Topology:
  """This process as one worker of a MultiWorkerMirroredStrategy cluster (TF_CONFIG,
  a "worker" job, worker 0 its chief), with tf_workers.DEVICES_ENV logical CPUs.
  The strategy is made here, before any TensorFlow op runs (it must be), and kept in
  handles; the devices are every worker's, in task order."""
  import json
  from tf_tput.runtime import tf_workers
  text = os.environ.get(cluster.ENV, "")
  try:
    tf_config = json.loads(text)
    workers, index = tf_config["cluster"]["worker"], tf_config["task"]["index"]
  except (ValueError, KeyError, TypeError):
    raise UsageError(f"--strategy=multi_worker for a program every worker runs needs "
                     f"{cluster.ENV} with a cluster.worker list and this task's index "
                     f"(got {text!r}); tf_tput.launch --num_workers=N sets it") from None
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  per_worker = int(os.environ.get(tf_workers.DEVICES_ENV, "1"))
  if per_worker > 1:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * per_worker)
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  devices = tuple(f"/job:worker/replica:0/task:{t}/device:CPU:{d}"
                  for t in range(len(workers)) for d in range(per_worker))
  loopback = all(_on_this_host(w) for w in workers)
  return Topology("tf", "cpu", devices,
                  provenance.cpu_model() if loopback else "remote host CPU",
                  num_processes=len(workers), strategy="multi_worker",
                  shares_host_cpu=loopback, handles={"strategy": strategy,
                                                     "task_index": index})


def _resolve_tpu(tpu_address) -> Topology:
  """Every core of a Cloud TPU slice (tf_tput.runtime.tpu connects and initializes it)."""
  from tf_tput.runtime import tpu
  tpu_slice = tpu.connect(tpu_address)
  return Topology("tf", "tpu", tpu_slice.devices, tpu_slice.accelerator_kind,
                  num_processes=tpu_slice.num_hosts, strategy="tpu",
                  session_target=tpu_slice.master, shares_host_cpu=False,
                  handles=tpu_slice.handles)


def _resolve_tpu_strategy(tpu_address) -> Topology:
  """Every core of a Cloud TPU under TF2's TPUStrategy (--system=tf2), which is made
  here, before any other op, and kept in handles. NOT exercised here: no TPU."""
  from tf_tput.runtime import tpu
  strategy, resolver = tpu.strategy(tpu_address)
  devices = tuple(strategy.extended.worker_devices)
  return Topology("tf", "tpu", devices, tpu.accelerator_kind(resolver),
                  num_processes=1, strategy="tpu", shares_host_cpu=False,
                  handles={"strategy": strategy, "resolver": resolver})


def _resolve_tf(num_cpu_devices: Optional[int]) -> Topology:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  cpu_kind = provenance.cpu_model()
  if num_cpu_devices:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
    names = tuple(f"/device:CPU:{i}" for i in range(num_cpu_devices))
    return Topology("tf", "cpu", names, cpu_kind)
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    details = tf.config.experimental.get_device_details(gpus[0])
    names = tuple(f"/device:GPU:{i}" for i in range(len(gpus)))
    return Topology("tf", "gpu", names, details.get("device_name", "GPU"))
  return Topology("tf", "cpu", ("/device:CPU:0",), cpu_kind)


def _resolve_jax(num_cpu_devices: Optional[int]) -> Topology:
  import jax

  num_processes, process_id = launched_processes()
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
                  islands=launched_islands())
