"""mtf_islands.allreduce_islands: the hierarchical all-reduce gives mtf's ring's result,
and the only tensors that cross between islands are one island's share per island."""

import numpy as np
import pytest

from tf_tput import compat
from tf_tput.systems.tensorflow.mtf import islands as mtf_islands


def _reduce(num_islands, per_island, shape, fn="SUM"):
  import tensorflow as tf
  graph = tf.Graph()
  n = num_islands * per_island
  values = [np.random.default_rng(i).normal(size=shape).astype(np.float32)
            for i in range(n)]
  # Placement does not change the arithmetic: every "device" is this process's CPU.
  devices = ["/device:CPU:0"] * n
  with graph.as_default():
    xs = [tf.constant(v) for v in values]
    ys = mtf_islands.allreduce_islands(xs, devices, num_islands, fn)
    with tf.compat.v1.Session(graph=graph) as session:
      return values, session.run(ys), graph


@pytest.mark.parametrize("num_islands, per_island", [(2, 4), (3, 2), (1, 4), (2, 1)])
def test_every_device_gets_the_sum(num_islands, per_island):
  values, out, _ = _reduce(num_islands, per_island, (16, 96))
  for y in out:
    np.testing.assert_allclose(y, np.sum(values, axis=0), rtol=1e-5, atol=1e-5)


def test_max_reduces_too():
  values, out, _ = _reduce(2, 2, (32, 64), "MAX")
  for y in out:
    np.testing.assert_array_equal(y, np.max(values, axis=0))


def test_a_small_tensor_takes_mtfs_ring():
  values, out, graph = _reduce(2, 2, (3,))
  assert not [op for op in graph.get_operations() if op.type == "Split"]
  for y in out:
    np.testing.assert_allclose(y, np.sum(values, axis=0), rtol=1e-6)


def test_only_the_islands_pieces_cross_between_islands():
  """Place island k on job k's devices and count the bytes of every edge whose ends
  are on different jobs: 2(K-1)/K of one island's tensor per island, 2(K-1) in all."""
  import tensorflow as tf
  compat.import_mtf()
  K, n, shape = 2, 4, (32, 64)
  devices = [f"/job:island{i // n}/task:0/device:CPU:{i % n}" for i in range(K * n)]
  graph = tf.Graph()
  with graph.as_default():
    xs = []
    for device in devices:
      with tf.device(device):
        xs.append(tf.zeros(shape))
    mtf_islands.allreduce_islands(xs, devices, K, "SUM")
  crossing = 0
  for op in graph.get_operations():
    for tensor in op.inputs:
      if tensor.op.device.split("/task")[0] != op.device.split("/task")[0]:
        crossing += tensor.shape.num_elements() * 4
  tensor_bytes = 32 * 64 * 4
  assert crossing == 2 * (K - 1) * tensor_bytes


def test_model_slices_are_reduced_across_islands_and_model_groups_stay_inside():
  """mesh batch:4;model:2 on 2 islands: a batch-axis group (one model slice) spans the
  islands, 2 devices in each; a model-axis group lies in one island (mtf's ring)."""
  import tensorflow as tf
  mtf, _ = compat.import_mtf()
  devices = [f"/job:island{i // 4}/task:0/device:CPU:{i % 4}" for i in range(8)]
  impl = mtf_islands.mesh_impl(mtf.convert_to_shape("batch:4;model:2"),
                               mtf.convert_to_layout_rules("batch:batch"), devices, 2)
  graph = tf.Graph()
  with graph.as_default():
    xs = []
    for device in devices:
      with tf.device(device):
        xs.append(tf.zeros((32, 64)))
    laid_out = impl.LaidOutTensor(xs)
    impl.allreduce(laid_out, [0], "SUM")  # over batch: 2 groups across the islands
    assert impl.reduced_bytes == 2 * 32 * 64 * 4
    impl.allreduce(laid_out, [1], "SUM")  # over model: 4 groups, each in one island
    assert impl.reduced_bytes == 2 * 32 * 64 * 4


def test_a_model_axis_before_the_batch_axis_is_one_line():
  """Each island must hold a block of the mesh: the batch axis comes first."""
  from tf_tput import config
  from tf_tput.errors import UsageError
  from tf_tput import island_split
  experiment = config.load_experiment(["gin/models/decoder_tiny.gin"],
                                      ["MeshConfig.mesh_shape = 'model:2;batch:2'"])
  with pytest.raises(UsageError, match="must come first.*'batch:2;model:2'"):
    island_split.check_mesh(experiment, 2, ("data", "model"))
  with pytest.raises(UsageError, match="or a system that splits the model inside islands"):
    island_split.check_mesh(experiment, 2, ("data",))
  good = config.load_experiment(["gin/models/decoder_tiny.gin"],
                                ["MeshConfig.mesh_shape = 'batch:2;model:2'"])
  island_split.check_mesh(good, 2, ("data", "model"))
