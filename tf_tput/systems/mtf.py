"""--system=mtf: the TensorFlow baseline, Mesh TensorFlow's transformer in a TF1 graph.

The model is built from mesh_tensorflow.transformer's own classes (Bitransformer for
T5, a causal Unitransformer for decoder-only LMs) with the layer stack that
mesh_tensorflow/transformer/gin/defaults.gin binds, passed explicitly here so that
mtf's gin registry stays out of the user's gin files. Training is mtf's
AdafactorOptimizer with its defaults (relative step size min(0.01, rsqrt(step + 1)),
parameter scaling, factored second moments), lowered by PlacementMeshImpl onto the
topology's devices (this process's, or every worker's of a TF_CONFIG cluster) and run
by one tf.compat.v1 Session: a single controller. On TPUs, mtf_tpu.py lowers the same
model with the SIMD implementation.
"""

import logging
import time
from typing import Optional

from tf_tput import cluster, compat, data, errors

CLOSE_WAIT_S = 5.0
LOST_WORKER_SETTLE_S = 3.0



def _layer_stack(mtf_t, m, with_enc_dec_attention: bool):
  """One stack of T5 blocks: what defaults.gin's make_layer_stack would build."""
  T, TL = mtf_t.transformer, mtf_t.transformer_layers
  layers = []
  for block in range(m.num_layers):
    block_layers = [TL.SelfAttention(
        num_heads=m.num_heads, key_value_size=m.d_kv, dropout_rate=0.0,
        relative_attention_type="bias_shared",
        relative_attention_num_buckets=m.relative_attention_num_buckets)]
    if with_enc_dec_attention:
      block_layers.append(TL.EncDecAttention(
          num_heads=m.num_heads, key_value_size=m.d_kv, dropout_rate=0.0))
    block_layers.append(TL.DenseReluDense(hidden_size=m.d_ff, dropout_rate=0.0))
    for index, layer in enumerate(block_layers):
      layer.set_name(f"block_{block:03d}/layer_{index:03d}")
      layers.append(layer)
  return T.LayerStack(
      layers,
      sublayers_initial=[T.sublayer_dropout],
      sublayers_per_layer=[T.sublayer_rms_norm, T.sublayer_call_layer,
                           T.sublayer_dropout, T.sublayer_residual],
      sublayers_final=[T.sublayer_rms_norm, T.sublayer_dropout])


def _unitransformer(mtf_t, experiment, name, autoregressive, with_enc_dec_attention,
                    max_length, output_vocab):
  m = experiment.model
  return mtf_t.transformer.Unitransformer(
      layer_stack=_layer_stack(mtf_t, m, with_enc_dec_attention),
      d_model=m.d_model, input_vocab_size=m.vocab_size, output_vocab_size=output_vocab,
      autoregressive=autoregressive, max_length=max_length, name=name,
      shared_embedding_and_softmax_weights=True, positional_embedding=False,
      layout=experiment.mesh.layout, mesh_shape=experiment.mesh.mesh_shape)


def build_loss(mtf, mtf_t, experiment, mesh, import_feature):
  """The model's training loss on `mesh`, as an mtf scalar.

  import_feature(key, length) -> the int32 mtf Tensor [batch, length] fed as `key`
  ("inputs", "targets", and with packing their "_segmentation" ids).
  """
  import tensorflow as tf
  m, d = experiment.model, experiment.data
  lengths = data.lengths_of(experiment)

  def feature(key, base):
    return import_feature(key, lengths[base])

  packed = d.pack
  variable_dtype = mtf.VariableDType(
      master_dtype=tf.float32, slice_dtype=tf.float32,
      activation_dtype=tf.as_dtype(m.activation_dtype))
  targets = feature("targets", "targets")
  targets_segmentation = feature("targets_segmentation", "targets") if packed else None
  if m.arch == "encoder_decoder":
    model = mtf_t.transformer.Bitransformer(
        encoder=_unitransformer(mtf_t, experiment, "encoder", False, False,
                                d.inputs_length, None),
        decoder=_unitransformer(mtf_t, experiment, "decoder", True, True,
                                d.targets_length, m.vocab_size))
    _, loss = model.call_simple(
        feature("inputs", "inputs"), targets, compute_loss=True, mode="train",
        variable_dtype=variable_dtype,
        encoder_sequence_id=feature("inputs_segmentation", "inputs") if packed else None,
        decoder_sequence_id=targets_segmentation)
    return loss
  model = _unitransformer(mtf_t, experiment, "decoder", True, False, d.targets_length,
                          m.vocab_size)
  # As Bitransformer does: without packing, padding (id 0) is its own sequence.
  sequence_id = (targets_segmentation if packed else mtf.minimum(targets, 1))
  _, loss = model.call_simple(
      mtf_t.transformer.autoregressive_inputs(targets, sequence_id=sequence_id),
      targets, compute_loss=True, mode="train", variable_dtype=variable_dtype,
      sequence_id=sequence_id)
  return loss


def optimizer_updates(mtf, graph, loss) -> list:
  """mtf's Adafactor (its defaults) on every trainable variable: the update operations."""
  grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
  return mtf.optimize.AdafactorOptimizer().apply_grads(grads, graph.trainable_variables)


def mesh_impl(mtf, experiment, topology):
  """How the mesh is lowered: PlacementMeshImpl over the topology's devices (one TF op
  per device slice), or on TPUs the SIMD implementation (one replicated program)."""
  shape = mtf.convert_to_shape(experiment.mesh.mesh_shape)
  layout = mtf.convert_to_layout_rules(experiment.mesh.layout)
  if topology.platform != "tpu":
    return mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout, list(topology.devices))
  assignment = topology.handles["device_assignment"]
  physical = [int(i) for i in assignment.topology.mesh_shape]
  if len(physical) == 4:  # [x, y, z, core] -> mtf's 3-D physical shape, as utils.py does
    physical = mtf.simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(physical)
  logical_to_physical = mtf.simd_mesh_impl.auto_logical_to_physical_tpu(
      shape.to_integer_list, physical, device_assignment=assignment)
  return mtf.simd_mesh_impl.SimdMeshImpl(shape, layout, None, assignment,
                                         logical_to_physical=logical_to_physical)


class MtfTrainer:
  """A lowered mtf graph in a Session; step() feeds one numpy batch."""

  def __init__(self, experiment, topology):
    import tensorflow as tf
    mtf, mtf_t = compat.import_mtf()
    # mtf logs its graph and memory statistics at INFO through TensorFlow's logger.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    tf1 = tf.compat.v1
    self._tf = tf
    self._graph = tf.Graph()
    with self._graph.as_default():
      tf1.set_random_seed(experiment.train.seed)  # the same initial weights every run
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      batch_dim = mtf.Dimension("batch", experiment.train.global_batch)
      self._placeholders = {}

      def import_feature(key, length):
        shape = [experiment.train.global_batch, length]
        self._placeholders[key] = tf1.placeholder(tf.int32, shape, name=key)
        return mtf.import_tf_tensor(mesh, self._placeholders[key], mtf.Shape(
            [batch_dim, mtf.Dimension("length", length)]))

      loss = build_loss(mtf, mtf_t, experiment, mesh, import_feature)
      self.num_params = sum(v.shape.size for v in graph.trainable_variables)
      global_step = tf1.train.get_or_create_global_step()
      updates = optimizer_updates(mtf, graph, loss)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl(mtf, experiment, topology)})
      self._loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
      # Adafactor's step size and decay read the global step; incrementing it only
      # after every update keeps step k on k (mtf's own runner leaves them unordered).
      with tf.control_dependencies([lowering.lowered_operation(op) for op in updates]):
        self._train_op = tf1.assign_add(global_step, 1)
      init = tf1.global_variables_initializer()
      copy_masters_to_slices = lowering.copy_masters_to_slices()
      self._copy_slices_to_masters = lowering.copy_slices_to_masters()
      # Lowering "autostacks" same-shaped variables into one (mtf's default speed-up);
      # keep each master with the names of the variables it holds.
      self._masters = [(getattr(v, "original_names", None), v.name, v.get_master())
                       for v in graph.trainable_variables]
      self._graph.finalize()
    self._session = tf1.Session(topology.session_target, graph=self._graph)
    self._session.run(init)
    self._session.run(copy_masters_to_slices)
    self._workers = list(topology.workers)
    # get_memory_info sees this process's GPUs only, not a cluster's.
    self._gpu_names = [dev.split("device:")[-1] for dev in topology.devices
                       if "GPU" in dev and not topology.session_target]

  def step(self, batch: dict) -> float:
    feed = {self._placeholders[k]: batch[k] for k in self._placeholders}
    try:
      loss, _ = self._session.run([self._loss, self._train_op], feed_dict=feed)
    except self._tf.errors.OpError as e:
      lost = cluster.unreachable(self._workers, settle_s=LOST_WORKER_SETTLE_S)
      if lost:  # name the worker, not only the gRPC symptom
        raise RuntimeError(f"{', '.join(map(str, lost))} unreachable: "
                           f"{errors.one_line(e, limit=200)}") from e
      raise
    return float(loss)

  def trace_step(self, batch: dict, path: str) -> tuple:
    """One step (unmeasured) under TF's full trace: (tf_trace.DeviceTime rows, wall s);
    its Chrome trace is written to path."""
    from tf_tput import tf_trace
    tf1 = self._tf.compat.v1
    feed = {self._placeholders[k]: batch[k] for k in self._placeholders}
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    metadata = tf1.RunMetadata()
    start = time.perf_counter()
    self._session.run([self._loss, self._train_op], feed_dict=feed, options=options,
                      run_metadata=metadata)
    wall_s = time.perf_counter() - start
    tf_trace.write_chrome_trace(metadata.step_stats, path)
    return tf_trace.summarize(metadata.step_stats), wall_s

  def export_variables(self) -> dict:
    """Current trainable values by mtf variable name (as tf_tput.models names them)."""
    self._session.run(self._copy_slices_to_masters)
    values = self._session.run([master for _, _, master in self._masters])
    out = {}
    for (stacked_names, name, _), value in zip(self._masters, values):
      out.update(zip(stacked_names, value) if stacked_names else [(name, value)])
    return out

  def device_memory_bytes(self) -> Optional[int]:
    """Peak bytes allocated on the GPUs; None on CPUs, where TF does not report it."""
    if not self._gpu_names:
      return None
    return sum(self._tf.config.experimental.get_memory_info(name)["peak"]
               for name in self._gpu_names)

  def close(self) -> None:
    if self._workers:  # a cluster's session may wait forever on a lost worker
      cluster.close_session(self._session, CLOSE_WAIT_S)
    else:
      self._session.close()


class MtfSystem:
  name = "mtf"
  framework = "tf"
  multi_process = False  # one Session drives every device: a single controller

  def build(self, experiment, topology):
    if topology.platform == "tpu":
      from tf_tput.systems.mtf_tpu import MtfTpuTrainer
      return MtfTpuTrainer(experiment, topology)
    return MtfTrainer(experiment, topology)


SYSTEM = MtfSystem()
