"""--strategy=tpu: the TF baseline on a Cloud TPU. NOT exercised by CI or on this
project's machines (they have no TPU); the tests cover everything up to the
connection: flag checks, resolver construction, the device assignment computed from
a TPU topology, and the choice of mtf's SIMD mesh implementation.

The path, as TPUEstimator took it for Mesh TensorFlow: TPUClusterResolver(--tpu,
--tpu_zone, --gcp_project) gives the TPU worker's master (grpc://...:8470) and its
cluster; a TF1 Session there runs tf.compat.v1.tpu.initialize_system(), whose result
is the slice's tf.tpu.experimental.Topology; a DeviceAssignment places one replica
(one mesh position) on each core. tf_tput.systems.mtf_tpu then lowers the model with
mtf's SimdMeshImpl (one program replicated over every core, collectives as
cross_replica_sum) in bfloat16 activations.
"""

import dataclasses
import re
from typing import Optional

from tf_tput import errors
from tf_tput.errors import UsageError

TPU_MASTER = re.compile(r"^grpc://[^:/]+:\d+$")


@dataclasses.dataclass(frozen=True)
class TpuAddress:
  name: str                  # a Cloud TPU's name, grpc://host:port, or "local" (TPU VM)
  zone: Optional[str] = None
  project: Optional[str] = None


def address_from_flags(tpu, tpu_zone, gcp_project) -> TpuAddress:
  """Checks --tpu / --tpu_zone / --gcp_project before TensorFlow starts."""
  if not tpu:
    raise UsageError("--strategy=tpu needs --tpu: the Cloud TPU's name (with "
                     "--tpu_zone/--gcp_project when not this VM's), grpc://HOST:8470, or "
                     "local on a TPU VM")
  if tpu.startswith("grpc://"):
    if not TPU_MASTER.match(tpu):
      raise UsageError(f"--tpu={tpu} is not grpc://HOST:PORT; e.g. grpc://10.0.0.2:8470")
    if tpu_zone or gcp_project:
      raise UsageError(f"--tpu={tpu} is an address already; --tpu_zone and "
                       "--gcp_project only qualify a TPU name")
  return TpuAddress(tpu, tpu_zone, gcp_project)


def kind_from_type(tpu_type: str) -> str:
  """--tpu_type (v3, v4, v5e, ... or an accelerator type such as v3-32) -> the device
  kind the peak table knows ("TPU v3"), checked before any framework starts."""
  from tf_tput.measure import peak
  known = sorted(key[len("tpu_"):] for key, _ in peak.PEAK_FLOPS if key.startswith("tpu_"))
  generation = tpu_type.lower().split("-")[0]
  if generation not in known:
    raise UsageError(f"--tpu_type={tpu_type} is not a TPU generation the peak table "
                     f"knows; use one of {', '.join(known)}")
  return f"TPU {generation}"


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
