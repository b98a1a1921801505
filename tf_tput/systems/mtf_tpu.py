"""The TF baseline on a Cloud TPU (--strategy=tpu). NOT exercised by CI: no TPU there.

Built the way Mesh TensorFlow's own TPUEstimator path built it, without the Estimator:
the mtf graph is traced once inside tf.compat.v1.tpu.replicate, one replica per TPU
core placed by the topology's DeviceAssignment (tf_tput.runtime.tpu), and lowered by mtf's
SimdMeshImpl (tf_tput.systems.mtf_model.mesh_impl). Every replica receives the whole global
batch, as TPUEstimator's BROADCAST input mode did, and SimdMeshImpl cuts its slice on
the core. Variables are mtf's: SimdMeshImpl creates one slice variable per core plus a
master copy on the host, initialized by copy_masters_to_slices as MtfRestoreHook did.

Not through tf.distribute.TPUStrategy's run(): inside its scope every variable created
becomes a mirrored variable with one copy per replica, while SimdMeshImpl creates and
places one variable per core slice itself. The resolver, the TPU system
initialization and the device assignment are the ones TPUStrategy would use.
"""

import logging
from typing import Optional

from tf_tput import compat, data
from tf_tput.systems import mtf_model


class MtfTpuTrainer:
  """One replicated training step per call; the loss of replica 0 on the host."""

  def __init__(self, experiment, topology):
    import tensorflow as tf
    mtf, mtf_t = compat.import_mtf()
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    tf1 = tf.compat.v1
    assignment = topology.handles["device_assignment"]
    features = data.features_of(experiment)
    if experiment.data.pack:
      features += tuple(f"{f}_segmentation" for f in features)
    lengths = data.lengths_of(experiment)
    batch = experiment.train.global_batch
    self._tf = tf
    self._graph = tf.Graph()
    built = {}
    with self._graph.as_default():
      tf1.set_random_seed(experiment.train.seed)
      self._placeholders = {k: tf1.placeholder(tf.int32, [batch, lengths[k.split("_")[0]]],
                                               name=k) for k in features}
      global_step = tf1.train.get_or_create_global_step()
      impl = mtf_model.mesh_impl(mtf, experiment, topology)

      def replica_step(*tensors):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        batch_dim = mtf.Dimension("batch", batch)
        given = dict(zip(features, tensors))

        def import_feature(key, length):
          shape = mtf.Shape([batch_dim, mtf.Dimension("length", length)])
          return mtf.import_fully_replicated(mesh, given[key], shape, name=key)

        loss = mtf_model.build_loss(mtf, mtf_t, experiment, mesh, import_feature)
        updates = mtf_model.optimizer_updates(mtf, graph, loss)
        lowering = mtf.Lowering(graph, {mesh: impl})
        built.update(lowering=lowering, num_params=sum(
            v.shape.size for v in graph.trainable_variables))
        tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
        with tf.control_dependencies([lowering.lowered_operation(op) for op in updates]):
          increment = tf1.assign_add(global_step, 1)
        with tf.control_dependencies([increment]):
          return [tf.identity(tf_loss)]

      inputs = [[self._placeholders[k] for k in features]] * assignment.num_replicas
      outputs = tf1.tpu.replicate(replica_step, inputs=inputs,
                                  device_assignment=assignment)
      self._loss = outputs[0][0]
      self.num_params = built["num_params"]
      self._initialize_tpu = tf1.tpu.initialize_system()
      self._shutdown_tpu = tf1.tpu.shutdown_system()
      init = tf1.global_variables_initializer()
      copy_masters_to_slices = built["lowering"].copy_masters_to_slices()
      self._graph.finalize()
    from tf_tput.runtime import tpu
    self._session = tf1.Session(topology.session_target, graph=self._graph,
                                config=tpu.session_config(tf, topology.handles["resolver"]))
    self._session.run(self._initialize_tpu)
    self._session.run(init)
    self._session.run(copy_masters_to_slices)

  def step(self, batch: dict) -> float:
    feed = {self._placeholders[k]: batch[k] for k in self._placeholders}
    return float(self._session.run(self._loss, feed_dict=feed))

  def device_memory_bytes(self) -> Optional[int]:
    return None  # TF1 sessions do not report TPU memory

  def close(self) -> None:
    try:
      self._session.run(self._shutdown_tpu)
    finally:
      self._session.close()
