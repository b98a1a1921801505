"""A Cloud TPU from TensorFlow (--strategy=tpu): resolved, initialized, its cores
assigned. NOT exercised by CI or on this project's machines (they have no TPU); the
tests cover everything up to the connection: resolver construction and the device
assignment computed from a TPU topology.

The path, as TPUEstimator took it for Mesh TensorFlow: TPUClusterResolver(--tpu,
--tpu_zone, --gcp_project) gives the TPU worker's master (grpc://...:8470) and its
cluster; a TF1 Session there runs tf.compat.v1.tpu.initialize_system(), whose result
is the slice's tf.tpu.experimental.Topology; a DeviceAssignment places one replica
(one mesh position) on each core. tf_tput.systems.tensorflow.mtf.tpu then lowers the model with
mtf's SimdMeshImpl (one program replicated over every core, collectives as
cross_replica_sum) in bfloat16 activations.
"""

import dataclasses
import socket
import time

from tf_tput import errors
from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime.tpu import TpuAddress


def cluster_resolver(address: TpuAddress):
  """TPUClusterResolver for the address (a name is looked up through the Cloud TPU API)."""
  import tensorflow as tf
  try:
    return tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=address.name, zone=address.zone, project=address.project)
  except Exception as e:  # noqa: BLE001 - any lookup failure is the user's to fix
    raise UsageError(f"--tpu={address.name}: cannot resolve it ({errors.one_line(e)}); "
                     "check the name, --tpu_zone and --gcp_project") from None


def device_assignment(tf, tpu_topology, num_cores: int):
  """One replica per core over the first num_cores cores of the slice."""
  available = tpu_topology.num_tasks * tpu_topology.num_tpus_per_task
  if num_cores > available:
    raise UsageError(f"the mesh needs {num_cores} TPU cores but the slice has "
                     f"{available}; use a smaller mesh_shape")
  return tf.tpu.experimental.DeviceAssignment.build(
      tpu_topology, computation_shape=[1] * tpu_topology.mesh_rank, num_replicas=num_cores)


def accelerator_kind(resolver) -> str:
  """'TPU v3' from the Cloud TPU API's accelerator type ('v3-32'), when it tells."""
  # The resolver keeps its Cloud TPU API client private; it is the one that knows.
  api = getattr(resolver, "_cloud_tpu_client", None)
  try:
    accelerator_type = api.accelerator_type() if api and api.api_available() else None
  except Exception:  # noqa: BLE001 - no API to ask (an address, or a TPU VM's "local")
    accelerator_type = None
  if accelerator_type:
    return f"TPU {accelerator_type.split('-')[0]}"
  return "TPU (type unknown: no Cloud TPU API answer)"


def nodes(resolver, master: str) -> tuple:
  """The slice's nodes, sorted: the hosts of the TPU workers the resolver's cluster
  lists (the Cloud TPU API's network endpoints: one per TPU host of a pod), else the
  master's host; a TPU VM's own chips (--tpu=local: no cluster, no master), this
  machine. NOT exercised (no TPU here): what a pod's resolver lists was read in TF's
  TPUClusterResolver.cluster_spec, never seen."""
  try:
    spec, job = resolver.cluster_spec(), resolver.task_type
    addresses = spec.job_tasks(job) if job in spec.jobs else []
  except Exception:  # noqa: BLE001 - no API to ask; the master still says where
    addresses = []
  if not addresses and master.startswith("grpc://"):
    addresses = [master[len("grpc://"):]]
  hosts = {a.rsplit(":", 1)[0].strip("[]") for a in addresses if a}
  return tuple(sorted(hosts)) if hosts else (provenance.this_node(),)


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A connected, initialized slice: what tf_tput.runtime.topology turns into a Topology."""
  master: str                # grpc://... of the TPU worker that runs the Session
  devices: tuple             # one TF device name per core, in replica order
  accelerator_kind: str      # "TPU v3", or a note that the type is unknown
  num_hosts: int
  handles: dict              # the resolver and the DeviceAssignment, kept alive


# TF's own bound on initialize_system (tpu_system_metadata): a pod's initialization
# can take minutes, so it gets at least this long, whatever --cluster_timeout_s says.
INITIALIZE_TIMEOUT_S = 300.0
PROBE_S = 1.0   # one TCP connection attempt to the master
TIMEOUT_FLAG = "--cluster_timeout_s"


def wait_for_master(address: TpuAddress, master: str, timeout_s: float) -> None:
  """Returns once the TPU worker's gRPC port (grpc://host:port) accepts a connection;
  TimeoutError naming the address and the flag when nothing answers within timeout_s.
  A Session to a master nobody serves would wait without end. '' (a TPU VM's own
  chips, in this process) has nothing to wait for."""
  if not master.startswith("grpc://"):
    return
  host, _, port = master[len("grpc://"):].rpartition(":")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      attempt_s = max(0.01, min(PROBE_S, deadline - time.monotonic()))
      socket.create_connection((host.strip("[]"), int(port)), attempt_s).close()
      return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise TimeoutError(f"--tpu={address.name}: nothing answered at {master} within "
                           f"{TIMEOUT_FLAG}={timeout_s:g} ({e.strerror or e}); check the "
                           "address and that the TPU is up, or raise the timeout") from None
      time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def connect(address: TpuAddress, timeout_s: float) -> TpuSlice:
  """Connects (waiting at most timeout_s for the master to answer), initializes the
  TPU system (at most max(timeout_s, INITIALIZE_TIMEOUT_S)), and assigns one replica to
  every core."""
  wait_for_master(address, address.name, timeout_s)  # an address: before TF's import
  import tensorflow as tf

  resolver = cluster_resolver(address)
  master = resolver.master()
  if master != address.name:
    wait_for_master(address, master, timeout_s)
  graph = tf.Graph()
  with graph.as_default():
    initialize = tf.compat.v1.tpu.initialize_system()
  limit_s = max(timeout_s, INITIALIZE_TIMEOUT_S)
  config = session_config(tf, resolver)
  config.operation_timeout_in_ms = int(limit_s * 1000)
  try:
    with tf.compat.v1.Session(master, graph=graph, config=config) as s:
      tpu_topology = tf.tpu.experimental.Topology(serialized=s.run(initialize))
  except tf.errors.DeadlineExceededError:
    raise TimeoutError(f"--tpu={address.name}: the TPU at {master or 'this host'} did not "
                       f"initialize within {limit_s:g} s (the larger of {TIMEOUT_FLAG}="
                       f"{timeout_s:g} and {INITIALIZE_TIMEOUT_S:g}); check that it is a "
                       "TPU worker that is up, or raise the timeout") from None
  cores = tpu_topology.num_tasks * tpu_topology.num_tpus_per_task
  assignment = device_assignment(tf, tpu_topology, cores)
  devices = tuple(assignment.tpu_device(replica=r) for r in range(cores))
  return TpuSlice(master, devices, accelerator_kind(resolver), tpu_topology.num_tasks,
                  {"resolver": resolver, "device_assignment": assignment})


def strategy(address: TpuAddress, timeout_s: float):
  """TF2's way onto a Cloud TPU (--system=tf2): connect (waiting at most timeout_s for
  the master to answer), initialize the TPU system eagerly and build a TPUStrategy over
  every core; (strategy, resolver)."""
  wait_for_master(address, address.name, timeout_s)  # an address: before TF's import
  import tensorflow as tf

  resolver = cluster_resolver(address)
  if resolver.master() != address.name:
    wait_for_master(address, resolver.master(), timeout_s)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver), resolver


def session_config(tf, resolver):
  """The Session config TPUEstimator used: the TPU job's cluster, isolated state."""
  config = tf.compat.v1.ConfigProto(allow_soft_placement=True, isolate_session_state=True)
  cluster_spec = resolver.cluster_spec()
  if cluster_spec:
    config.cluster_def.CopyFrom(cluster_spec.as_cluster_def())
  return config
