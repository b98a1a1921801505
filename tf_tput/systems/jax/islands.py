"""--system=jax across islands (Pathways §5.3): data parallel over an outermost
`island` mesh axis, gradients reduced inside each island first so that one copy per
island crosses the slower inter-island link.

Left to itself XLA:CPU compiles the gradient sum over every device as one flat
all-reduce, whose ring crosses the island boundary for every device. The step is
therefore written in shard_map over ('island', 'batch'): each device takes the
gradient of its own rows, then the flattened gradient is reduce-scattered within the
island, the 1/n shard all-reduced across islands, and all-gathered within the
island again. Each of an island's n devices sends 1/n of the gradient across, so the
island sends one copy (tf_tput.reduction.analytic_link_bytes).

The device array comes from process order (CPU devices report no slice index):
tf_tput.launch puts consecutive processes in one island, and jax.devices() lists
devices process-major, so row k of the [islands, n] array is island k. Inside an
island the mesh is data parallel only (config: island_split.check_mesh); the
parameters and Adafactor state are replicated.
"""

import numpy as np

from tf_tput import models
from tf_tput.systems.jax import trainer as jax_trainer


class JaxIslandTrainer(jax_trainer.JaxTrainer):
  """JaxTrainer's interface; only the mesh and the step's reduction differ."""

  def __init__(self, experiment, topology):  # not super().__init__: a flat mesh
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tf_tput.systems.jax import model as jax_model

    self._jax = jax
    m, K = experiment.model, topology.islands
    devices = np.asarray(jax.devices())
    n = devices.size // K
    self._mesh = Mesh(devices.reshape(K, n), ("island", "batch"))
    replicated = NamedSharding(self._mesh, P())
    self._param_shardings = {v.name: replicated for v in models.variables(m)}
    self._batch_sharding = NamedSharding(self._mesh, P(("island", "batch"), None))
    self._optimizer = jax_model.adafactor()
    self._params = jax.jit(lambda: jax_model.init_params(m, experiment.train.seed),
                           out_shardings=self._param_shardings)()
    self.num_params = sum(p.size for p in self._params.values())
    self._init_state = jax.jit(self._optimizer.init, out_shardings=replicated)
    self._opt_state = self._init_state(self._params)

    def island_gradients(params, batch):
      """Per device: the loss and gradient of its rows, then the hierarchical sum."""
      loss, grads = jax.value_and_grad(jax_model.loss_fn)(params, batch, m)
      flat, unravel = ravel_pytree(grads)
      pad = -flat.size % n
      flat = jnp.pad(flat, (0, pad))
      shard = jax.lax.psum_scatter(flat, "batch", tiled=True)   # within the island
      shard = jax.lax.psum(shard, "island")                     # one copy crosses
      flat = jax.lax.all_gather(shard, "batch", tiled=True)     # within the island
      # Each device's loss is its rows' mean; equal rows: the mean of the means.
      total = K * n
      return (jax.lax.psum(loss, ("island", "batch")) / total,
              unravel(flat[:flat.size - pad] / total))

    gradients = jax.shard_map(island_gradients, mesh=self._mesh,
                              in_specs=(P(), P(("island", "batch"))),
                              out_specs=(P(), P()), check_vma=False)

    def train_step(params, opt_state, batch):
      loss, grads = gradients(params, batch)
      updates, opt_state = self._optimizer.update(grads, opt_state, params)
      return jax.tree.map(lambda p, u: p + u, params, updates), opt_state, loss

    self._step = jax.jit(train_step, donate_argnums=(0, 1),
                         in_shardings=(self._param_shardings, replicated,
                                       self._batch_sharding),
                         out_shardings=(self._param_shardings, replicated, replicated))
