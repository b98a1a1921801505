"""tf_tput/compat: mesh_tensorflow imports and trains on current TensorFlow."""

import itertools

import numpy as np


def test_apply_provides_estimator_names():
  from tf_tput import compat
  compat.apply()
  compat.apply()   # idempotent
  import tensorflow as tf
  assert tf.compat.v1.estimator.ModeKeys.TRAIN == "train"
  assert tf.compat.v1.estimator.ModeKeys.EVAL == "eval"
  assert tf.compat.v1.estimator.ModeKeys.PREDICT == "infer"
  assert hasattr(tf.compat.v1.estimator, "SessionRunHook")
  assert hasattr(tf.compat.v1.estimator, "CheckpointSaverListener")


def test_import_mtf_returns_modules():
  from tf_tput import compat
  mtf, mtf_transformer = compat.import_mtf()
  assert mtf.__name__ == "mesh_tensorflow"
  assert mtf_transformer.__name__ == "mesh_tensorflow.transformer"
  assert hasattr(mtf, "placement_mesh_impl")
  assert hasattr(mtf_transformer, "transformer")


def test_tiny_mtf_model_trains():
  """A two-layer dense regression on a batch:2;model:2 mesh: the loss falls."""
  import tensorflow as tf

  from tf_tput import compat
  mtf, _ = compat.import_mtf()
  tf1 = tf.compat.v1

  rng = np.random.default_rng(0)
  x_np = rng.standard_normal((8, 16)).astype(np.float32)
  y_np = (x_np @ rng.standard_normal((16, 4)).astype(np.float32)) / 4.0

  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(0)
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "mesh")
    batch = mtf.Dimension("batch", 8)
    d = mtf.Dimension("d", 16)
    hidden = mtf.Dimension("hidden", 32)
    out = mtf.Dimension("out", 4)
    x = mtf.import_tf_tensor(mesh, tf.constant(x_np), mtf.Shape([batch, d]))
    y = mtf.import_tf_tensor(mesh, tf.constant(y_np), mtf.Shape([batch, out]))
    h = mtf.layers.dense(x, hidden, name="h")        # [batch, hidden]: hidden split
    pred = mtf.layers.dense(h, out, name="out")
    loss = mtf.reduce_mean(mtf.square(pred - y))
    variables = mtf_graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.SgdOptimizer(0.05).apply_grads(grads, variables)

    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.convert_to_shape("batch:2;model:2"),
        mtf.convert_to_layout_rules("hidden:model;batch:batch"), [""] * 4)
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    # The layout really splits: the hidden kernel lives in 2 slices per model axis.
    assert mesh_impl.tensor_layout(h.shape).tensor_axis_to_mesh_axis == (0, 1)
    tf_loss = lowering.export_to_tf_tensor(loss)
    train_op = tf.group([lowering.lowered_operation(op) for op in updates])
    init = tf1.global_variables_initializer()
    copy = lowering.copy_masters_to_slices()

  with tf1.Session(graph=graph) as session:
    session.run(init)
    session.run(copy)
    losses = [float(session.run([tf_loss, train_op])[0]) for _ in range(20)]

  assert all(np.isfinite(losses))
  assert losses[-1] < 0.5 * losses[0], losses
  assert sum(b < a for a, b in itertools.pairwise(losses)) >= 15, losses


def test_pkg_resources_stand_in_finds_mtf_defaults_gin():
  import os

  from tf_tput import compat
  resource_filename = compat._pkg_resources_stand_in().resource_filename
  path = resource_filename("mesh_tensorflow.transformer.utils", "gin/defaults.gin")
  assert os.path.isfile(path) and path.endswith("transformer/gin/defaults.gin")
