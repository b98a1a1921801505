"""--system=mtf with PipelineConfig.stages > 1: a GPipe pipeline in one mtf Graph.

Still mesh_tensorflow.transformer's layers, but one mtf.Mesh per stage ("stage_0",
...), each lowered by its own PlacementMeshImpl over its device group
(pipeline.stage_devices) with the mesh file's shape and layout; mtf.Lowering takes
the several meshes at once. mtf has no operation that moves a tensor from one mesh to
another and carries its gradient back, so StageTransfer below is one.

The M micro-batches (consecutive row blocks of the global batch) are unrolled in the
graph: the embedding on stage 0, each stage's blocks (pipeline.stage_layer_ranges,
named by their global index, so variable names are the unpipelined model's), the
final norm, the softmax on the shared embedding and mtf's loss on the last stage.
The loss is the sum of the micro-batch losses, each over the global denominator
(batch * length, as the unpipelined model divides), so it and its gradient are the
unpipelined ones. One mtf.gradients, one Adafactor update, one Session.run per step:
TensorFlow's dataflow executor runs whatever is ready, so stage s can work on
micro-batch m while stage s+1 works on m-1 (GPipe's schedule, not enforced; a
--trace_dir trace shows whether the stages overlap).
"""

import copy

from tf_tput import compat, island_split, pipeline
from tf_tput.systems.tensorflow.mtf import model as mtf_model
from tf_tput.systems.tensorflow.mtf.trainer import MtfTrainer

mtf, _ = compat.import_mtf()


class StageTransfer(mtf.Operation):
  """x on one stage's mesh, as the same tensor on another's.

  Every stage mesh has the same shape and layout, so slice i of x belongs on device i
  of the other group: the lowering copies each slice there (tf.identity under that
  device; TensorFlow inserts the send/receive). The gradient is the reverse copy.
  """

  def __init__(self, x, mesh, name=None):
    super().__init__([x], mesh=mesh, name=name or "stage_transfer")
    self._outputs = [mtf.Tensor(self, x.shape, x.dtype)]

  def gradient(self, grad_ys):
    dy, = grad_ys
    return [None if dy is None else stage_transfer(dy, self.inputs[0].mesh)]

  def lower(self, lowering):
    import tensorflow as tf
    source = lowering.mesh_impl(self.inputs[0])
    target = lowering.mesh_impl(self)
    if source.shape != target.shape or source.layout_rules != target.layout_rules:
      raise ValueError(f"{self.name}: meshes of different shape or layout "
                       f"({source.shape} vs {target.shape})")
    slices = []
    xs = lowering.tensors[self.inputs[0]].to_laid_out_tensor().all_slices
    for device, x in zip(target.devices, xs, strict=True):
      with tf.device(device):
        slices.append(tf.identity(x))
    lowering.set_tensor_lowering(self.outputs[0], target.LaidOutTensor(slices))


def stage_transfer(x, mesh):
  return x if x.mesh is mesh else StageTransfer(x, mesh).outputs[0]


class MtfPipelineTrainer(MtfTrainer):
  """MtfTrainer's Session, update, export and trace around a pipelined loss."""

  def _build_model(self, mtf, mtf_t, graph, experiment, topology):
    import tensorflow as tf
    tf1 = tf.compat.v1
    T = mtf_t.transformer
    m, d, p = experiment.model, experiment.data, experiment.pipeline
    S, M = p.stages, p.micro_batches
    rows = experiment.train.global_batch // M
    meshes = [mtf.Mesh(graph, f"stage_{s}") for s in range(S)]
    shape = mtf.convert_to_shape(experiment.mesh.mesh_shape)
    layout = mtf.convert_to_layout_rules(experiment.mesh.layout)
    self.stage_devices = pipeline.stage_devices(topology.devices, S)
    self.mesh_impls = [mtf.placement_mesh_impl.PlacementMeshImpl(shape, layout, devices)
                       for devices in self.stage_devices]
    # The unpipelined decoder supplies its dimensions, its layer objects (mtf names
    # them block_000/layer_000, block_000/layer_001, ...) and its loss; the stages
    # call those pieces themselves, since the decoder's own call would build
    # everything on one mesh.
    model = mtf_model._unitransformer(mtf_t, experiment, "decoder", True, False,
                                      d.targets_length, m.vocab_size)
    stack = model.layer_stack
    per_block = len(stack.layers) // m.num_layers
    ranges = pipeline.stage_layer_ranges(m.num_layers, S)
    variable_dtype = mtf.VariableDType(  # as mtf_model.build_loss
        master_dtype=tf.float32, slice_dtype=tf.float32,
        activation_dtype=tf.as_dtype(m.activation_dtype))
    batch_dim = mtf.Dimension("batch", rows)
    length_dim = mtf.Dimension("length", d.targets_length)
    for key in ("targets",) + (("targets_segmentation",) if d.pack else ()):
      self._placeholders[key] = tf1.placeholder(
          tf.int32, [experiment.train.global_batch, d.targets_length], name=key)

    def feature(key, s, micro):  # micro-batch `micro`'s rows, imported on stage s
      block = self._placeholders[key][micro * rows:(micro + 1) * rows]
      return mtf.import_tf_tensor(meshes[s], block, mtf.Shape([batch_dim, length_dim]))

    embedding = softmax_embedding = None
    shared_bias = {}   # stage -> block_000's relative-bias cache entries on that stage
    losses = []
    with tf1.variable_scope(model.name):
      for micro in range(M):
        x = None
        for s, (first, last) in enumerate(ranges):
          mesh = meshes[s]
          targets = feature("targets", s, micro)
          # As Unitransformer.call_simple and mtf_model.build_loss set them up, per
          # stage because every mtf tensor lives on one mesh.
          sequence_id = (feature("targets_segmentation", s, micro) if d.pack
                         else mtf.minimum(targets, 1))
          position = mtf.range(mesh, length_dim, dtype=tf.int32)
          context = T.Context(
              model=model, mesh=mesh, batch_dims=[batch_dim], length_dim=length_dim,
              variable_dtype=variable_dtype, mode="train", losses=[],
              sequence_id=sequence_id, position=position, position_is_default=True,
              write_priority=position, read_priority=position, num_microbatches=M)
          if s == 0:
            inputs = T.autoregressive_inputs(targets, sequence_id=sequence_id)
            context.inputs = inputs
            if embedding is None:
              embedding = T.get_vocab_embedding_cls()(
                  mesh, model.input_vocab_dim, model.model_dim, variable_dtype,
                  name="embedding", ensemble_dim=model.ensemble_dim)
            inputs = mtf.dropout(inputs, context.train, rate=model.token_dropout_rate)
            x = embedding.ids_to_embedding(inputs, context)
            context.input_embeddings = x
            x = stack._call_sublayers(stack._sublayers_initial, x, context)
          else:
            x = stage_transfer(x, mesh)
            if s not in shared_bias:  # sent once; its gradient sums every micro-batch's
              shared_bias[s] = {key: stage_transfer(value, mesh)
                                for key, value in shared_bias[0].items()}
          # "bias_shared": block_000 creates the bias and caches it; later blocks (and
          # later micro-batches) read the cache, here the stage's copy of it.
          context.cache.update(shared_bias.get(s, {}))
          context.layer_index = first * per_block
          for layer in stack.layers[first * per_block:last * per_block]:
            with tf1.variable_scope(layer.name):   # as LayerStack.call
              x = stack._layer_fn(x, layer, context)
            context.layer_index += 1
          if s == 0 and 0 not in shared_bias:
            shared_bias[0] = dict(context.cache)
        # The last stage: LayerStack.call's end, then Unitransformer's softmax on the
        # shared embedding, sent here, and its loss.
        x = stack._call_sublayers(stack._sublayers_final, x, context)
        x = T.sublayer_mask_padding(x, stack, context)
        if softmax_embedding is None:
          softmax_embedding = copy.copy(embedding)
          softmax_embedding._embedding_weights = stage_transfer(
              embedding._embedding_weights, meshes[-1])
        logits = softmax_embedding.hidden_to_logits(x, context)
        # Divides by loss_denominator(targets, M) = rows * length * M: the global one.
        losses.append(model._compute_loss(context, logits, targets,
                                          model.output_vocab_dim))
    return mtf.add_n(losses), dict(zip(meshes, self.mesh_impls, strict=True))

  def _analytic_link_bytes(self, graph, mesh_to_impl, experiment, topology):
    """Across islands (stages split across them in order): the bytes of every
    StageTransfer between stages in different islands, counted in the graph after
    mtf.gradients, so the backward transfers are there too (each micro-batch's
    activations forward, their gradient back; the relative bias and the embedding
    sent once, their gradients back), each slice of each device (a tensor replicated
    inside the stage is sent once per device), plus the rows of every input the
    chief (in island 0) feeds a stage in another island. None on one island."""
    K, S = topology.islands, experiment.pipeline.stages
    if K < 2:
      return None
    stage_of = {mesh: s for s, mesh in enumerate(mesh_to_impl)}  # _build_model's order
    sent = 0
    for op in graph.operations:
      if isinstance(op, StageTransfer):
        source, target = stage_of[op.inputs[0].mesh], stage_of[op.mesh]
        if (island_split.island_of_stage(source, S, K)
            != island_split.island_of_stage(target, S, K)):
          # Every device's slice is copied, replicated ones too (the embedding).
          y = op.outputs[0]
          sent += mesh_to_impl[op.mesh].laid_out_size(y.shape) * y.dtype.size
    remote_stages = sum(island_split.island_of_stage(s, S, K) != 0 for s in range(S))
    fed = sum(p.shape.num_elements() * p.dtype.size for p in self._placeholders.values())
    return sent + remote_stages * fed
