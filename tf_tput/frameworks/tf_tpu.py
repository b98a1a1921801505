"""A Cloud TPU from TensorFlow (--strategy=tpu): resolved, initialized, its cores
assigned. NOT exercised by CI or on this project's machines (they have no TPU); the
tests cover everything up to the connection: resolver construction and the device
assignment computed from a TPU topology.

The path, as TPUEstimator took it for Mesh TensorFlow: TPUClusterResolver(--tpu,
--tpu_zone, --gcp_project) gives the TPU worker's master (grpc://...:8470) and its
cluster; a TF1 Session there runs tf.compat.v1.tpu.initialize_system(), whose result
is the slice's tf.tpu.experimental.Topology; a DeviceAssignment places one replica
(one mesh position) on each core. tf_tput.systems.mtf_tpu then lowers the model with
mtf's SimdMeshImpl (one program replicated over every core, collectives as
cross_replica_sum) in bfloat16 activations.
"""

import dataclasses

from tf_tput import errors
from tf_tput.errors import UsageError
from tf_tput.runtime.tpu import TpuAddress


def cluster_resolver(address: TpuAddress):
  """TPUClusterResolver for the address (a name is looked up through the Cloud TPU API)."""
  import tensorflow as tf
  try:
    return tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=address.name, zone=address.zone, project=address.project)
  except Exception as e:  # noqa: BLE001: any lookup failure is the user's to fix
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
  except Exception:  # noqa: BLE001: no API to ask (an address, or a TPU VM's "local")
    accelerator_type = None
  if accelerator_type:
    return f"TPU {accelerator_type.split('-')[0]}"
  return "TPU (type unknown: no Cloud TPU API answer)"


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A connected, initialized slice: what tf_tput.runtime.topology turns into a Topology."""
  master: str                # grpc://... of the TPU worker that runs the Session
  devices: tuple             # one TF device name per core, in replica order
  accelerator_kind: str      # "TPU v3", or a note that the type is unknown
  num_hosts: int
  handles: dict              # the resolver and the DeviceAssignment, kept alive


def connect(address: TpuAddress) -> TpuSlice:
  """Connects, initializes the TPU system, and assigns one replica to every core."""
  import tensorflow as tf

  resolver = cluster_resolver(address)
  master = resolver.master()
  graph = tf.Graph()
  with graph.as_default():
    initialize = tf.compat.v1.tpu.initialize_system()
  with tf.compat.v1.Session(master, graph=graph, config=session_config(tf, resolver)) as s:
    tpu_topology = tf.tpu.experimental.Topology(serialized=s.run(initialize))
  cores = tpu_topology.num_tasks * tpu_topology.num_tpus_per_task
  assignment = device_assignment(tf, tpu_topology, cores)
  devices = tuple(assignment.tpu_device(replica=r) for r in range(cores))
  return TpuSlice(master, devices, accelerator_kind(resolver), tpu_topology.num_tasks,
                  {"resolver": resolver, "device_assignment": assignment})


def strategy(address: TpuAddress):
  """TF2's way onto a Cloud TPU (--system=tf2): connect, initialize the TPU system
  eagerly and build a TPUStrategy over every core; (strategy, resolver)."""
  import tensorflow as tf

  resolver = cluster_resolver(address)
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
