"""TensorFlow's runtime (tf_tput.runtime.Runtime): devices, the peak probe's
matmul, the barrier and the worker servers, for every system built on TF (mtf, tf2).

Devices per --strategy:
  local         `--num_cpu_devices=N` splits the host CPU into N logical devices (they
                share its cores); otherwise GPUs are used when present, else the CPU.
  multi_worker  a system whose one process drives workers (mtf): this process is the
                chief of the cluster and its devices are every worker's (cluster.py);
                the cluster is TF_CONFIG's, or a Slurm job step's tasks through TF's
                SlurmClusterResolver, task 0 the chief; the other tasks serve
                (serve_worker). A system whose every worker runs the program (tf2):
                this process is one worker of a MultiWorkerMirroredStrategy.
  tpu           a Cloud TPU through TPUClusterResolver (tpu.py): mtf's Session and
                tpu.replicate, or tf2's TPUStrategy.
"""

import json
import os
import shutil
import socket
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import islands, topology as topology_lib
from tf_tput.runtime.topology import Topology
from tf_tput.systems.tensorflow import cluster as tf_cluster, server as tf_server
from tf_tput.systems.tensorflow import workers as tf_workers
from tf_tput import runtime as runtime_lib


# TF's switch between its Eigen kernels and oneDNN's; unset, TF turns oneDNN on only
# where the CPU has AVX-512 VNNI, BF16 or AMX.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


class TfRuntime(runtime_lib.Runtime):
  name = "tf"
  finds_local_tpus = False  # TF reaches a TPU through --strategy=tpu only
  serves_workers = True     # tf.distribute.Server processes (tf_workers)
  chief_drives_workers = True  # mtf's chief: train's other processes serve_worker
  startup_noise = tf_server.STARTUP_NOISE
  # TF's matmul, whichever system runs it (mtf's mesh_tensorflow adds none).
  distributions = {"tensorflow": ("tensorflow", "tensorflow-cpu")}

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None:
    launch = topology_lib.launched()
    if not every_worker and strategy == "local" and os.environ.get(tf_cluster.ENV):
      raise UsageError(f"{tf_cluster.ENV} is set (a cluster) but --strategy=local; pass "
                       f"--strategy=multi_worker, or unset {tf_cluster.ENV} to run "
                       "locally")
    if not every_worker and strategy == "multi_worker":
      if not cluster_timeout_s > 0:
        raise UsageError(f"--cluster_timeout_s={cluster_timeout_s}; it must be > 0")
      if launch.launcher == "slurm":
        return  # the cluster is Slurm's tasks (slurm_resolver), known once TF imports
      if launch.process_id:  # a worker of a TF_CONFIG cluster: it serves (serve_worker)
        tf_cluster.parse_tf_config(os.environ.get(tf_cluster.ENV, ""), as_worker=True)
        return
      chief, _ = tf_cluster.parse_tf_config(os.environ.get(tf_cluster.ENV, ""))
      tf_cluster.check_port_free(chief)

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    if strategy == "multi_worker":
      return (_resolve_workers(cluster_timeout_s) if every_worker
              else _resolve_cluster(cluster_timeout_s))
    if strategy == "tpu":
      return (_resolve_tpu_strategy(tpu_address, cluster_timeout_s) if every_worker
              else _resolve_tpu(tpu_address, cluster_timeout_s))
    return _resolve_local(num_cpu_devices)

  def gemm_paths(self, strategy: str, dtype: str) -> dict:
    """TF's CPU matmuls through Eigen or oneDNN (TF_ENABLE_ONEDNN_OPTS, read when TF
    loads), on local devices; where the environment sets the variable, that path
    only. On a TPU, or where the devices are worker servers' (started with their own
    environment), none."""
    if strategy != "local":
      return {}
    set_value = os.environ.get(ONEDNN_ENV)
    if set_value is not None:
      name = "eigen" if set_value.strip().lower() in ("0", "false") else "onednn"
      return {name: {ONEDNN_ENV: set_value}}
    return {"eigen": {ONEDNN_ENV: "0"}, "onednn": {ONEDNN_ENV: "1"}}

  def matmul_runner(self, topology, n: int, dtype: str):
    from tf_tput.measure import peak
    import tensorflow as tf
    where = f"tf {dtype} peak probe"
    if topology.session_target:
      return _session_matmul_runner(tf, topology, n, dtype, where)
    with tf.device(topology.devices[0]):
      a = tf.ones([n, n], dtype=dtype)
      b = tf.identity(a)

    def run():
      with tf.device(topology.devices[0]):
        peak.check_matmul_corner(tf.cast(tf.matmul(a, b)[0, 0], tf.float32), n, where)
    return run

  def barrier(self, topology):
    """Workers that all run the program (tf2 multi_worker) meet in an all-reduce over
    their strategy; one process, or a chief that drives servers, waits for nobody."""
    strategy = topology.handles.get("strategy")
    if topology.num_processes == 1 or strategy is None:
      return lambda name: None
    import tensorflow as tf

    @tf.function
    def all_reduce():
      return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, tf.constant(1.0)))
    return lambda name: all_reduce()

  def serve_worker(self, timeout_s: float) -> int:
    return serve_worker(timeout_s)

  def launch_workers(self, command, every_worker: bool, num_workers: int,
                     devices_per_worker: int, grace_s: float, timeout_s, start_timeout_s,
                     ports=None, network=None, chief_env=None) -> int:
    if every_worker:  # not across islands (tf_tput.launch refuses that): network is
      # None or a runtime.namespaces.PrivateNetwork
      return tf_workers.launch_every_worker(command, num_workers, devices_per_worker,
                                            grace_s, timeout_s,
                                            ports[:num_workers] if ports else None,
                                            network=network)
    return tf_workers.launch(command, num_workers, devices_per_worker, grace_s,
                             timeout_s, start_timeout_s, ports, network=network,
                             chief_env=chief_env)


RUNTIME = TfRuntime()


def gpu_peak_bytes(tf, gpu_names) -> Optional[int]:
  """Peak bytes TensorFlow allocated on these GPUs ('GPU:0', ...); None without any:
  TF reports no device memory for CPUs."""
  if not gpu_names:
    return None
  return sum(tf.config.experimental.get_memory_info(name)["peak"] for name in gpu_names)


def _session_matmul_runner(tf, topology, n: int, dtype: str, where: str):
  """The matmul on the first device of a cluster, run through the cluster's master."""
  from tf_tput.measure import peak
  graph = tf.Graph()
  with graph.as_default(), tf.device(topology.devices[0]):
    a = tf.Variable(tf.ones([n, n], dtype=dtype))
    corner = tf.cast(tf.matmul(a, a)[0, 0], tf.float32)
  session = tf.compat.v1.Session(topology.session_target, graph=graph)
  session.run(a.initializer)
  return lambda: peak.check_matmul_corner(session.run(corner), n, where)


def slurm_resolver(tf, every_worker: bool):
  """TensorFlow's own resolver of a Slurm job step's tasks: every task a worker where
  every worker runs the program, else task 0 the chief and the others its workers.
  Task i listens on its node at tf_cluster.slurm_port_base(job) + its local index."""
  launch = topology_lib.launched()
  jobs = ({tf_cluster.WORKER: launch.num_processes} if every_worker else
          {tf_cluster.CHIEF: 1, tf_cluster.WORKER: launch.num_processes - 1})
  if shutil.which("nvidia-smi"):  # the resolver counts the GPUs and shares them out
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=jobs, port_base=tf_cluster.slurm_port_base(launch.job_id))
  # It places one task per GPU slot of a node (none without nvidia-smi): on CPUs, a
  # slot for every task, never handed out (auto_set_gpu off), and its cluster kept
  # without the slots, which MultiWorkerMirroredStrategy would take for GPUs.
  slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
      jobs=jobs, port_base=tf_cluster.slurm_port_base(launch.job_id),
      gpus_per_node=launch.num_processes, gpus_per_task=1, auto_set_gpu=False)
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      slurm.cluster_spec(), task_type=slurm.task_type, task_id=slurm.task_id,
      rpc_layer=slurm.rpc_layer, num_accelerators={})


def _chief_and_workers(every_worker: bool, as_worker: bool = False):
  """(resolver or None, chief address, [Worker]) of this process's cluster: Slurm's
  tasks (TensorFlow imported to resolve them), else TF_CONFIG's (checked without it;
  as_worker: its task is a worker that serves the chief, not the chief)."""
  if topology_lib.launched().launcher != "slurm":
    chief, workers = tf_cluster.parse_tf_config(os.environ.get(tf_cluster.ENV, ""),
                                                as_worker=as_worker)
    return None, chief, workers
  import tensorflow as tf
  resolver = slurm_resolver(tf, every_worker)
  spec = resolver.cluster_spec().as_dict()
  return (resolver, (spec.get(tf_cluster.CHIEF) or [None])[0],
          [tf_cluster.Worker(i, a) for i, a in enumerate(spec[tf_cluster.WORKER])])


def serve_worker(timeout_s: float) -> int:
  """This process as a worker server of a chief that drives it (mtf under srun, or a
  TF_CONFIG worker task running the train command): serves until the chief has come
  and gone; 1 when it never comes within timeout_s. Its exit code."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  resolver, chief, _ = _chief_and_workers(every_worker=False, as_worker=True)
  resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(
      resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
      start=True)  # one CPU device, or the GPUs TensorFlow finds
  print(f"{resolver.task_type} {resolver.task_id} serving {server.target} for the chief "
        f"at {chief}", flush=True)
  return tf_cluster.serve_until_chief_leaves(chief, timeout_s)


def _resolve_cluster(cluster_timeout_s: float) -> Topology:
  """Joins the cluster (TF_CONFIG's, or a Slurm step's tasks) as its chief; the mesh
  spans every worker's devices."""
  resolver, chief, workers = _chief_and_workers(every_worker=False)
  tf_cluster.check_port_free(chief, "the Slurm step's" if resolver else f"{tf_cluster.ENV}'s")
  tf_cluster.wait_for_workers(workers, cluster_timeout_s)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  resolver = resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                task_index=resolver.task_id, start=True)
  # CreateSession and ListDevices wait for every worker; bound that wait.
  config = tf.compat.v1.ConfigProto(
      operation_timeout_in_ms=int(cluster_timeout_s * 1000))
  with tf.compat.v1.Session(server.target, config=config) as session:
    listed = [d.name for d in session.list_devices()]
  workers = tf_cluster.with_devices(workers, listed)
  devices = tuple(d for w in workers for d in w.devices)
  gpu = "/device:GPU:" in devices[0]
  loopback = all(_on_this_host(w.address) for w in workers)
  kind = ("GPU" if gpu else provenance.cpu_model() if loopback else "remote host CPU")
  return Topology("tf", "gpu" if gpu else "cpu", devices, kind,
                  num_processes=len(workers), strategy="multi_worker",
                  session_target=server.target, workers=tuple(workers),
                  shares_host_cpu=loopback and not gpu, handles={"server": server},
                  islands=topology_lib.launched_islands(),
                  nodes=nodes_of(w.address for w in workers))


def nodes_of(addresses) -> tuple:
  """A cluster's nodes from its workers' host:port addresses, distinct and sorted (the
  chief holds no devices). A remote worker's node is its address's host: this process
  cannot ask it its name. Workers on this machine are named as they would name
  themselves (provenance.this_node): on loopback, this process's node; in an island
  tf_tput.launch made here, this machine at the island's address."""
  def node(address):
    host = address.rsplit(":", 1)[0].strip("[]")
    if not _on_this_host(address):
      return host
    return (provenance.this_node() if _loopback(address) or _named_as_this_host(address)
            else provenance.node_at(host))
  return tuple(sorted({node(address) for address in addresses}))


def _loopback(address: str) -> bool:
  return address.startswith(("127.", "localhost:", "[::1]"))


def _named_as_this_host(address: str) -> bool:
  """The address names this machine by its host name, as Slurm names a task's node."""
  host, name = address.rsplit(":", 1)[0], socket.gethostname()
  return host in (name, name.split(".")[0])


def _on_this_host(address: str) -> bool:
  """Loopback, this machine's host name, or inside the islands tf_tput.launch made
  here (network namespaces of this host, on 198.18.0.0/15)."""
  if _loopback(address) or _named_as_this_host(address):
    return True
  import ipaddress
  host = address.rsplit(":", 1)[0]
  try:
    return (topology_lib.launched_islands() > 0
            and ipaddress.ip_address(host) in islands.ADDRESS_BLOCK)
  except ValueError:
    return False


def _resolve_workers(timeout_s: float) -> Topology:
  """This process as one worker of a MultiWorkerMirroredStrategy cluster (TF_CONFIG's
  "worker" job, or a Slurm step's tasks; worker 0 its chief), with
  tf_workers.DEVICES_ENV logical CPUs (one under Slurm). The strategy is made
  here, before any TensorFlow op runs (it must be), and kept in handles; the devices
  are every worker's, in task order.

  Making it waits for every worker to register with worker 0's coordination service,
  without end by default; timeout_s bounds that wait (_join_workers)."""
  resolver = None
  if topology_lib.launched().launcher == "slurm":
    import tensorflow as tf
    resolver = slurm_resolver(tf, every_worker=True)
    workers, index = resolver.cluster_spec().as_dict()[tf_cluster.WORKER], resolver.task_id
  else:
    text = os.environ.get(tf_cluster.ENV, "")
    try:
      tf_config = json.loads(text)
      workers, index = tf_config["cluster"]["worker"], tf_config["task"]["index"]
    except (ValueError, KeyError, TypeError):
      raise UsageError(f"--strategy=multi_worker for a program every worker runs needs "
                       f"{tf_cluster.ENV} with a cluster.worker list and this task's "
                       f"index (got {text!r}), or the tasks of a Slurm job step; "
                       "tf_tput.launch --num_workers=N sets it") from None
  if index == 0:  # see _join_workers; before TensorFlow's import, which takes seconds
    tf_cluster.wait_for_workers([tf_cluster.Worker(i, address)
                                 for i, address in enumerate(workers) if i], timeout_s)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf
  per_worker = int(os.environ.get(tf_workers.DEVICES_ENV, "1"))
  if per_worker > 1:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * per_worker)
  strategy = _join_workers(tf, workers, index, timeout_s, resolver)
  devices = tuple(f"/job:worker/replica:0/task:{t}/device:CPU:{d}"
                  for t in range(len(workers)) for d in range(per_worker))
  loopback = all(_on_this_host(w) for w in workers)
  return Topology("tf", "cpu", devices,
                  provenance.cpu_model() if loopback else "remote host CPU",
                  num_processes=len(workers), strategy="multi_worker",
                  shares_host_cpu=loopback, handles={"strategy": strategy,
                                                     "task_index": index},
                  nodes=nodes_of(workers))


def _join_workers(tf, workers: list, index: int, timeout_s: float, resolver=None):
  """MultiWorkerMirroredStrategy, its waits for the other workers bounded by timeout_s.

  TF's coordination service (on worker 0) waits for every worker to register, and a
  worker for worker 0, without end, inside a call that holds the interpreter. So
  worker 0 first waits (in Python, _resolve_workers) until every other worker's
  server accepts connections: theirs start as they make the strategy, before they
  register. The others register with a deadline (the service's
  cluster_register_timeout, set here before TF would set it without one) and fail
  when worker 0 never serves."""
  from tensorflow.python.distribute import multi_worker_util
  from tensorflow.python.eager import context
  if context.context().coordination_service is None:
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(
            {tf_cluster.WORKER: list(workers)}),
        cluster_register_timeout_in_ms=int(timeout_s * 1000))
    context.context().coordination_service.coordinated_job_list.add(
        name=tf_cluster.WORKER, num_tasks=len(workers))
  try:
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
  except tf.errors.DeadlineExceededError:
    raise TimeoutError(f"worker {index}: worker 0 ({workers[0]}) did not gather every "
                       f"worker of {tf_cluster.ENV} within --cluster_timeout_s="
                       f"{timeout_s:g}; start them all (python -m tf_tput.launch "
                       "--num_workers=N does) or raise the timeout") from None


def _resolve_tpu(tpu_address, timeout_s: float) -> Topology:
  """Every core of a Cloud TPU slice (tf_tpu connects and initializes it)."""
  from tf_tput.systems.tensorflow import tpu as tf_tpu
  tpu_slice = tf_tpu.connect(tpu_address, timeout_s)
  return Topology("tf", "tpu", tpu_slice.devices, tpu_slice.accelerator_kind,
                  num_processes=tpu_slice.num_hosts, strategy="tpu",
                  session_target=tpu_slice.master, shares_host_cpu=False,
                  handles=tpu_slice.handles,
                  nodes=tf_tpu.nodes(tpu_slice.handles["resolver"], tpu_slice.master))


def _resolve_tpu_strategy(tpu_address, timeout_s: float) -> Topology:
  """Every core of a Cloud TPU under TF2's TPUStrategy, which is made here, before any
  other op, and kept in handles. NOT exercised here: no TPU."""
  from tf_tput.systems.tensorflow import tpu as tf_tpu
  strategy, resolver = tf_tpu.strategy(tpu_address, timeout_s)
  devices = tuple(strategy.extended.worker_devices)
  return Topology("tf", "tpu", devices, tf_tpu.accelerator_kind(resolver),
                  num_processes=1, strategy="tpu", shares_host_cpu=False,
                  handles={"strategy": strategy, "resolver": resolver},
                  nodes=tf_tpu.nodes(resolver, resolver.master()))


def _resolve_local(num_cpu_devices: Optional[int]) -> Topology:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  cpu_kind, here = provenance.cpu_model(), (provenance.this_node(),)
  if num_cpu_devices:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
    names = tuple(f"/device:CPU:{i}" for i in range(num_cpu_devices))
    return Topology("tf", "cpu", names, cpu_kind, nodes=here)
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    details = tf.config.experimental.get_device_details(gpus[0])
    names = tuple(f"/device:GPU:{i}" for i in range(len(gpus)))
    return Topology("tf", "gpu", names, details.get("device_name", "GPU"), nodes=here)
  return Topology("tf", "cpu", ("/device:CPU:0",), cpu_kind, nodes=here)
