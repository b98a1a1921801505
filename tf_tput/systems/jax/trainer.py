"""The JAX adapter's data-parallel / SPMD trainer and the sharding helpers its
island and pipeline trainers share (islands.py, pipeline.py import them here,
so no trainer module imports the System that chooses between them: system.py).

The mesh string becomes a jax.sharding.Mesh over the devices (all processes' devices
when launched by tf_tput.launch), the layout rules become PartitionSpecs: each
variable's mtf dimension names (tf_tput.models.variables) map to mesh axes, and so do
the activations' (model.py calls `constrain` with their dimension names). One jitted
train step with explicit shardings and donated parameter and optimizer buffers; the
numerics are model.py's twin of mesh_tensorflow.transformer.

compile(batch) compiles the step ahead of time for batches shaped as the first (the
shared loop times it, compile_s) and the step runs that executable from then on.
dispatch() returns the step's loss unfetched, so the shared loop can keep
TrainConfig.sync_every steps in flight before it waits; step() waits for each. A
process never runs ahead of the others by more than that window (unbounded dispatch
across processes once hung gloo collectives, see docs/design.md).
"""

import functools
import operator
from typing import Optional

import numpy as np

from tf_tput import models
from tf_tput import systems
from tf_tput.numerics import check_variable_names


def partition_spec(dim_names, layout: dict, mesh_axes):
  """PartitionSpec of a tensor whose axes carry these mtf dimension names."""
  from jax.sharding import PartitionSpec
  used, spec = set(), []
  for name in dim_names:
    axis = layout.get(name)
    if axis in mesh_axes and axis not in used:  # an axis may shard one dimension only
      used.add(axis)
      spec.append(axis)
    else:
      spec.append(None)
  return PartitionSpec(*spec)


def device_mesh(mesh_shape: tuple, devices: list) -> np.ndarray:
  """The devices arranged as the mesh. On TPUs in the order of the chips' physical
  torus (mesh_utils.create_device_mesh), so the innermost mesh axes, which carry the
  most traffic, map to neighbouring chips; elsewhere in jax.devices() order, which is
  process-major, so each launched process's devices stay contiguous."""
  if devices and devices[0].platform == "tpu":
    from jax.experimental import mesh_utils
    return mesh_utils.create_device_mesh(mesh_shape, devices)
  return np.asarray(devices).reshape(mesh_shape)


def local_peak_bytes(jax) -> Optional[int]:
  """Peak bytes in use on this process's devices, where the backend reports it."""
  peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
  return sum(peaks) if peaks and None not in peaks else None


class JaxTrainer(systems.Trainer):
  """Parameters and Adafactor state sharded over a Mesh; step() runs one jitted update."""
  synchronous_step = False  # dispatch() leaves the loss on the device, pending
  compiles_ahead = True     # compile(): the loop's first batch, timed as compile_s

  def __init__(self, experiment, topology):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from tf_tput.systems.jax import model as jax_model

    self._jax = jax
    m = experiment.model
    mesh_shape = experiment.mesh_shape
    devices = device_mesh(tuple(mesh_shape.values()), jax.devices())
    self._mesh = Mesh(devices, tuple(mesh_shape))
    layout = experiment.layout

    def sharding(dim_names):
      return NamedSharding(self._mesh, partition_spec(dim_names, layout, mesh_shape))

    variables = models.variables(m)
    self._param_shardings = {v.name: sharding([n for n, _ in v.dims]) for v in variables}
    self._batch_sharding = sharding(("batch", "length"))

    def constrain(x, dim_names):
      return jax.lax.with_sharding_constraint(x, sharding(dim_names))

    self._optimizer = jax_model.adafactor()
    replicated = NamedSharding(self._mesh, PartitionSpec())
    shapes = {v.name: tuple(size for _, size in v.dims) for v in variables}

    def state_sharding(path, leaf):
      """A slot shaped like its variable is sharded like it; factored rows/columns
      and counters (small) are replicated."""
      names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
      name = next((n for n in names if n in shapes), None)
      if name and leaf.shape == shapes[name]:
        return self._param_shardings[name]
      return replicated

    self._params = jax.jit(lambda: jax_model.init_params(m, experiment.train.seed),
                           out_shardings=self._param_shardings)()
    self.num_params = sum(p.size for p in self._params.values())  # what was built
    state_shardings = jax.tree_util.tree_map_with_path(
        state_sharding, jax.eval_shape(self._optimizer.init, self._params))
    self._init_state = jax.jit(self._optimizer.init, out_shardings=state_shardings)
    self._opt_state = self._init_state(self._params)

    def train_step(params, opt_state, batch):
      loss, grads = jax.value_and_grad(jax_model.loss_fn)(params, batch, m, constrain)
      updates, opt_state = self._optimizer.update(grads, opt_state, params)
      params = jax.tree.map(lambda p, u: p + u, params, updates)
      return params, opt_state, loss

    self._step = jax.jit(
        train_step, donate_argnums=(0, 1),
        in_shardings=(self._param_shardings, state_shardings, self._batch_sharding),
        out_shardings=(self._param_shardings, state_shardings, replicated))

  def _global_array(self, value: np.ndarray):
    """This process's shards of a global numpy batch, as one global jax.Array."""
    return self._jax.make_array_from_callback(value.shape, self._batch_sharding,
                                              lambda index: value[index])

  def compile(self, batch: dict) -> None:
    """Compiles the step for batches shaped as `batch` (the loop's first), before the
    first step; the step runs that executable from then on, and a batch of another
    shape is refused rather than compiled again. Once only: a later loop over the
    same trainer (tf_tput.overhead's rounds) finds it compiled."""
    if not hasattr(self._step, "lower"):  # a jax.stages.Compiled already
      return
    arrays = {k: self._global_array(v) for k, v in batch.items()}
    self._step = self._step.lower(self._params, self._opt_state, arrays).compile()

  def dispatch(self, batch: dict):
    """Starts one step; its loss as an unfetched jax.Array (float() waits for it)."""
    arrays = {k: self._global_array(v) for k, v in batch.items()}
    self._params, self._opt_state, loss = self._step(self._params, self._opt_state, arrays)
    return loss.addressable_data(0)  # replicated: every process holds the value

  def step(self, batch: dict) -> float:
    return float(self.dispatch(batch))

  def load_variables(self, values: dict) -> None:
    """Replaces the parameters (e.g. the TF baseline's initial values) and resets Adafactor."""
    check_variable_names(self._param_shardings, values)
    self._params = {k: self._jax.make_array_from_callback(
        np.shape(values[k]), self._param_shardings[k],
        functools.partial(operator.getitem, np.asarray(values[k], np.float32)))
        for k in self._param_shardings}
    self._opt_state = self._init_state(self._params)

  def export_variables(self) -> dict:
    return {k: np.asarray(self._jax.device_get(v)) for k, v in self._params.items()}

  def device_memory_bytes(self) -> Optional[int]:
    return local_peak_bytes(self._jax)

  def close(self) -> None:
    self._params = self._opt_state = None
