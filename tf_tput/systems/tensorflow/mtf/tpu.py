"""The TF baseline on a Cloud TPU (--strategy=tpu). NOT exercised by CI: no TPU there.

Built the way Mesh TensorFlow's own TPUEstimator path built it, without the Estimator:
the mtf graph is traced once inside tf.compat.v1.tpu.replicate, one replica per TPU
core placed by the topology's DeviceAssignment (tf_tput.systems.tensorflow.tpu), and lowered by mtf's
SimdMeshImpl (tf_tput.systems.tensorflow.mtf.model.mesh_impl). Each replica is fed only its slice
of the batch (replica_slices: the batch rows of its position on the mesh axis the
layout gives "batch"; replicas along the other axes share a slice), imported as an
already laid-out tensor, as mtf's own SimdMeshImplInputReader fed its infeed.
Variables are mtf's: SimdMeshImpl creates one slice variable per core plus a
master copy on the host, initialized by copy_masters_to_slices as MtfRestoreHook did.

Not through tf.distribute.TPUStrategy's run(): inside its scope every variable created
becomes a mirrored variable with one copy per replica, while SimdMeshImpl creates and
places one variable per core slice itself. The resolver, the TPU system
initialization and the device assignment are the ones TPUStrategy would use.
"""

import dataclasses
import logging
from typing import Optional

from tf_tput import compat, data
from tf_tput.systems.tensorflow.mtf import model as mtf_model
from tf_tput import systems


def replica_slices(mesh_shape: dict, layout: dict, logical_to_physical, dims) -> tuple:
  """(slice shape, [begin per replica]) of a tensor with these (name, size) dims, as
  SimdMeshImpl lays it out; replicas in the DeviceAssignment's order.

  Replica r runs mtf's logical processor p with logical_to_physical[p] == r (the
  pnum_tensor SimdMeshImpl reads on the core); p's mesh coordinates are row-major over
  mesh_shape. A dimension the layout puts on a mesh axis of size n is cut into n
  blocks, and p holds the block at its coordinate on that axis; a dimension on no
  axis is whole. So replicas that differ only along other axes get the same slice.
  """
  axes, sizes = list(mesh_shape), list(mesh_shape.values())

  def axis_of(name):
    axis = layout.get(name)
    return axes.index(axis) if axis in mesh_shape else None

  shape = tuple(size if axis_of(name) is None else size // sizes[axis_of(name)]
                for name, size in dims)
  logical_of = {physical: logical for logical, physical in enumerate(logical_to_physical)}
  begins = []
  for replica in range(len(logical_to_physical)):
    coordinates, rest = [0] * len(sizes), logical_of[replica]
    for i in reversed(range(len(sizes))):
      rest, coordinates[i] = divmod(rest, sizes[i])
    begins.append(tuple(0 if axis_of(name) is None else extent * coordinates[axis_of(name)]
                        for (name, _), extent in zip(dims, shape, strict=True)))
  return shape, begins


@dataclasses.dataclass
class Feed:
  """One placeholder: one feature's slice, given to every replica that holds it."""
  feature: str
  begin: tuple
  placeholder: object

  def value(self, batch: dict, shape: tuple):
    rows, columns = self.begin
    return batch[self.feature][rows:rows + shape[0], columns:columns + shape[1]]


@dataclasses.dataclass
class TpuGraph:
  """The replicated training step and what running it needs, before any Session."""
  graph: object
  loss: object
  feeds: list           # Feed per distinct (feature, slice)
  slice_shapes: dict    # feature -> shape of one replica's slice
  replica_feeds: list   # per replica: its Feed per feature, in feature order
  num_params: int
  initialize_tpu: object
  shutdown_tpu: object
  init: object
  copy_masters_to_slices: object

  def feed_dict(self, batch: dict) -> dict:
    return {f.placeholder: f.value(batch, self.slice_shapes[f.feature]) for f in self.feeds}


def build_graph(experiment, topology) -> TpuGraph:
  """Traces the mtf step in tpu.replicate; needs the DeviceAssignment, not the TPU."""
  import tensorflow as tf
  mtf, mtf_t = compat.import_mtf()
  tf1 = tf.compat.v1
  assignment = topology.handles["device_assignment"]
  features = data.features_of(experiment)
  if experiment.data.pack:
    features += tuple(f"{f}_segmentation" for f in features)
  lengths = data.lengths_of(experiment)
  batch = experiment.train.global_batch
  graph, built = tf.Graph(), {}
  with graph.as_default():
    tf1.set_random_seed(experiment.train.seed)
    global_step = tf1.train.get_or_create_global_step()
    impl = mtf_model.mesh_impl(mtf, experiment, topology)
    logical_to_physical = [impl.l2p(p) for p in range(impl.size)]
    feeds, slice_shapes, by_replica = [], {}, [[] for _ in range(assignment.num_replicas)]
    for feature in features:
      dims = (("batch", batch), ("length", lengths[feature.split("_")[0]]))
      shape, begins = replica_slices(experiment.mesh_shape, experiment.layout,
                                     logical_to_physical, dims)
      slice_shapes[feature], distinct = shape, {}
      for replica, begin in enumerate(begins):
        if begin not in distinct:
          distinct[begin] = Feed(feature, begin, tf1.placeholder(
              tf.int32, shape, name=f"{feature}_{len(distinct)}"))
          feeds.append(distinct[begin])
        by_replica[replica].append(distinct[begin])

    def replica_step(*tensors):
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      batch_dim = mtf.Dimension("batch", batch)
      given = dict(zip(features, tensors, strict=True))  # this replica's slices

      def import_feature(key, length):
        shape = mtf.Shape([batch_dim, mtf.Dimension("length", length)])
        return mtf.import_laid_out_tensor(mesh, impl.LaidOutTensor([given[key]]), shape,
                                          name=key)

      loss = mtf_model.build_loss(mtf, mtf_t, experiment, mesh, import_feature)
      updates = mtf_model.optimizer_updates(mtf, mtf_graph, loss)
      lowering = mtf.Lowering(mtf_graph, {mesh: impl})
      built.update(lowering=lowering, num_params=sum(
          v.shape.size for v in mtf_graph.trainable_variables))
      tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
      with tf.control_dependencies([lowering.lowered_operation(op) for op in updates]):
        increment = tf1.assign_add(global_step, 1)
      with tf.control_dependencies([increment]):
        return [tf.identity(tf_loss)]

    outputs = tf1.tpu.replicate(
        replica_step, inputs=[[f.placeholder for f in mine] for mine in by_replica],
        device_assignment=assignment)
    out = TpuGraph(graph, outputs[0][0], feeds, slice_shapes, by_replica,
                   built["num_params"], tf1.tpu.initialize_system(),
                   tf1.tpu.shutdown_system(), tf1.global_variables_initializer(),
                   built["lowering"].copy_masters_to_slices())
  graph.finalize()
  return out


class MtfTpuTrainer(systems.Trainer):
  """One replicated training step per call; the loss of replica 0 on the host."""

  def __init__(self, experiment, topology):
    import tensorflow as tf
    from tf_tput.systems.tensorflow import tpu as tf_tpu
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    self._built = build_graph(experiment, topology)
    self.num_params = self._built.num_params
    self._session = tf.compat.v1.Session(
        topology.session_target, graph=self._built.graph,
        config=tf_tpu.session_config(tf, topology.handles["resolver"]))
    self._session.run(self._built.initialize_tpu)
    self._session.run(self._built.init)
    self._session.run(self._built.copy_masters_to_slices)

  def step(self, batch: dict) -> float:
    return float(self._session.run(self._built.loss,
                                   feed_dict=self._built.feed_dict(batch)))

  def device_memory_bytes(self) -> Optional[int]:
    return None  # TF1 sessions do not report TPU memory

  def close(self) -> None:
    try:
      self._session.run(self._built.shutdown_tpu)
    finally:
      self._session.close()
