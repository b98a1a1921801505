"""--system=mtf across islands (Pathways §5.3): PlacementMeshImpl with a hierarchical
all-reduce, so that one copy of each gradient per island crosses the inter-island link.

tf_tput.launch --islands=K --num_workers=N starts the TF workers inside their islands'
network namespaces, consecutive tasks in one island, so the chief's device list
(every worker's, in task order) is island-major: island k holds devices
[k*n, (k+1)*n). mtf's own PlacementMeshImpl.allreduce is a ring over that list,
sharded and rotated, whose chains cross the island boundary two to four times per
shard. Here an all-reduce over a group that spans the islands is written instead as
  1. reduce-scatter inside each island: the flattened tensor in n pieces, piece j of
     every island member reduced on the island's j-th device;
  2. all-reduce across islands: piece j among the islands' j-th devices, with mtf's
     own ring (allreduce_ring), so each island sends 2(K-1)/K of its reduced tensor;
  3. all-gather inside each island: every device concatenates its island's pieces.
That is the reduction jax/islands.py writes in shard_map, and the one
tf_tput.reduction.analytic_link_bytes counts. The master's graph partitioner
turns each cross-worker edge into a gRPC Send/Recv, which is what the links carry.
Small tensors (the loss, scalars) and groups inside one island keep mtf's ring. With
a model axis inside the islands (mesh 'batch:B;model:M', batch first) each model
slice's group is reduced the same way, so one copy of every slice crosses per island.

What crosses is not one gradient per parameter: mtf all-reduces a tensor where its
batch dimension disappears, which for the shared relative attention bias is the
gradient of the [length, memory, heads] bias before its gather from the buckets, far
larger than the [heads, buckets] variable. The mesh counts the bytes it lowers into
these all-reduces (reduced_bytes), and the record's analytic link bytes use them.
"""

from tf_tput import compat


def allreduce_islands(xs, devices, num_islands: int, reduction_fn_string: str = "SUM"):
  """xs[i] (on devices[i], island-major) reduced everywhere, hierarchically (above)."""
  import tensorflow as tf
  mtf, _ = compat.import_mtf()
  ring = mtf.placement_mesh_impl.allreduce_ring
  n_all = len(xs)
  per_island = n_all // num_islands
  shape = xs[0].shape.as_list()
  size = None if None in shape else mtf.list_product(shape)
  if n_all % num_islands or size is None or size < 1024 or size % per_island:
    return ring(xs, devices, reduction_fn_string)
  reduce = mtf.binary_reduction_fn(reduction_fn_string)
  pieces = [None] * n_all  # pieces[i][j]: device i's j-th piece
  for i, (x, device) in enumerate(zip(xs, devices, strict=True)):
    with tf.device(device):
      pieces[i] = tf.split(tf.reshape(x, [-1]), per_island)
  island_sums = []  # [island][j], on the island's j-th device
  for k in range(num_islands):
    members = range(k * per_island, (k + 1) * per_island)
    sums = []
    for j in range(per_island):
      with tf.device(devices[k * per_island + j]):
        total = pieces[members[0]][j]
        for i in members[1:]:
          total = reduce(total, pieces[i][j])
      sums.append(total)
    island_sums.append(sums)
  reduced = [[None] * per_island for _ in range(num_islands)]
  for j in range(per_island):
    across = ring([island_sums[k][j] for k in range(num_islands)],
                  [devices[k * per_island + j] for k in range(num_islands)],
                  reduction_fn_string)
    for k in range(num_islands):
      reduced[k][j] = across[k]
  out = []
  for i, device in enumerate(devices):
    with tf.device(device):
      out.append(tf.reshape(tf.concat(reduced[i // per_island], 0), shape))
  return out


def mesh_impl(shape, layout, devices, num_islands: int):
  """A PlacementMeshImpl whose all-reduces over groups that span every island are
  allreduce_islands. With a model axis inside the islands (the batch axis first:
  island_split.check_mesh), each model slice's group spans the islands with an
  equal, island-major share in each."""
  mtf, _ = compat.import_mtf()
  per_island = len(devices) // num_islands
  island_of = {device: i // per_island for i, device in enumerate(devices)}

  def spans_islands(group_devices) -> bool:
    islands = [island_of[d] for d in group_devices]
    share = len(islands) // num_islands
    return islands == [i // share for i in range(len(islands))] if share else False

  class IslandPlacementMeshImpl(mtf.placement_mesh_impl.PlacementMeshImpl):
    reduced_bytes = 0  # of every tensor lowered into an all-reduce across the islands

    def allreduce(self, x, mesh_axes, reduction_fn_string):
      def collective(xs, group_devices):
        if spans_islands(group_devices):
          self.reduced_bytes += xs[0].shape.num_elements() * xs[0].dtype.size
          return allreduce_islands(xs, group_devices, num_islands, reduction_fn_string)
        return mtf.placement_mesh_impl.allreduce_ring(xs, group_devices,
                                                      reduction_fn_string)
      return self._collective_with_groups(x, mesh_axes, collective)

  return IslandPlacementMeshImpl(shape, layout, devices)
