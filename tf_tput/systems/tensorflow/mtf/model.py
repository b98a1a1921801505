"""The TF baseline's model, as mesh_tensorflow.transformer builds it: one mtf graph
from the gin model, its loss, mtf's Adafactor updates, and how the mesh is lowered.

Shared by the Session trainer (systems/tensorflow/mtf/trainer.py) and the Cloud TPU trainer
(systems/tensorflow/mtf/tpu.py), so both train exactly the same graph.
"""

from tf_tput import data


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
  per device slice; across islands with islands.py's reduction), or on TPUs the SIMD
  implementation (one replicated program)."""
  shape = mtf.convert_to_shape(experiment.mesh.mesh_shape)
  layout = mtf.convert_to_layout_rules(experiment.mesh.layout)
  # tf_tput.launch --islands=K, K > 1: the hierarchical reduction. One island keeps
  # mtf's ring: reduce-scattering over all of one island's devices sends most pieces
  # between its workers over gRPC (islands_local, 2 workers x 4 devices on loopback:
  # 1,119 tokens/s against the ring's 1,738).
  if topology.islands > 1:
    from tf_tput.systems.tensorflow.mtf import islands as mtf_islands
    return mtf_islands.mesh_impl(shape, layout, list(topology.devices), topology.islands)
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
