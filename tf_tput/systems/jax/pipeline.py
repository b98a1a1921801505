"""--system=jax with PipelineConfig.stages > 1: a GPipe pipeline, decoder-only models.

The design of MaxText's and praxis's pipelines and of the JAX shard_map notes:

* One Mesh over every device, shaped [S, *mesh_shape], axes ('stage', *mesh axes);
  stage s is pipeline.stage_devices group s, and the mesh file's layout applies
  inside each group (the in-stage axes are shard_map "auto" axes: XLA's SPMD
  partitioner shards each stage's work by the layout, as in JaxTrainer).
* Block weights stacked [S, Lmax, ...] and sharded P('stage', None, <layout spec>):
  stage s's devices hold stage s's layers only, and so does their Adafactor state
  (the optimizer is vmapped over the two stacked axes, see _StackedAdafactor).
  Stages hold different numbers of layers (pipeline.stage_layer_counts, e.g.
  3, 4, 4, 3): each stacks to Lmax with zero-filled slots that a lax.cond skips, so a
  padded slot does no work, gets a zero gradient and Adafactor leaves it at zero.
* The step is a shard_map manual over 'stage' around a lax.scan of M + S - 1
  iterations: stage 0 embeds micro-batch t, stage s runs its layers on what stage
  s - 1 sent at t - 1 (lax.ppermute over 'stage'), the last stage computes micro-
  batch t - (S-1)'s loss. A stage with no micro-batch at t (the GPipe bubble) takes
  the lax.cond branch that does nothing, so bubble iterations add no loss and no
  gradient. jax.checkpoint around the iteration body keeps only each iteration's
  stage input for the backward pass (GPipe's rematerialisation); jax.grad goes
  through the scan and the ppermutes (their transpose sends cotangents back).

The in-stage mesh axes are left to XLA's partitioner (shard_map axis_names={'stage'}),
so any layout (data and model parallel) works inside a stage. With data parallelism
XLA:CPU all-reduces each layer's gradient within the stage in every loop iteration
rather than once per step; making the batch axis manual as well (one psum after the
loop) was tried and measured slower on decoder_deep, s4_m16, batch:2 on 8 CPU devices
(about 2.4 s against 1.9 s a step), so it is not done.

Not layer-stacked: the embedding (stage 0 embeds with it, the last stage's softmax
multiplies by it), the relative attention bias (one per stack, used by every layer of
every stage) and the final rms_norm scale. They are replicated over the 'stage' axis
(each stage keeps a copy, sharded by the layout inside the stage) and shard_map's
transpose sums their gradients over the stages (a psum across stages of these three
gradients only). Memory cost: S - 1 extra copies of the embedding (vocab x d_model
float32) and of its Adafactor state per stage group; the bias (heads x buckets) and
the norm (d_model) are negligible. Sending the embedding's gradient between stage 0
and S - 1 only would save those copies on the inner stages; the replicated copy is
simpler and exact. pipeline.stage_plan counts the embedding on the first and last
stages only, so it underestimates the inner stages by one embedding and its state.

Numerics are model.py's (its building blocks are reused, not copied): the loss is the
mean over the M micro-batches of jax_model._loss, each divided by its micro-batch's
targets.size, so it equals loss_fn on the whole batch up to float rounding.
"""

from typing import Optional

import numpy as np

from tf_tput import models, pipeline, reduction
from tf_tput.config import mesh_size
from tf_tput.numerics import check_variable_names, sequence_id_of
from tf_tput.systems.jax.trainer import device_mesh, local_peak_bytes, partition_spec
from tf_tput import systems

STAGE = "stage"
STACK = "decoder"
# The per-block weights, by their name inside block_NNN (mtf's, tf_tput.models).
BLOCK_WEIGHTS = ("layer_000/rms_norm/scale", "layer_000/SelfAttention/q",
                 "layer_000/SelfAttention/k", "layer_000/SelfAttention/v",
                 "layer_000/SelfAttention/o", "layer_001/rms_norm/scale",
                 "layer_001/DenseReluDense/wi/kernel", "layer_001/DenseReluDense/wo/kernel")
EMBEDDING = f"{STACK}/embedding"
RELATIVE_BIAS = f"{STACK}/block_000/layer_000/SelfAttention/relative_attention_bias"
FINAL_NORM = f"{STACK}/rms_norm/scale"
SHARED = (EMBEDDING, RELATIVE_BIAS, FINAL_NORM)


def block_name(layer: int, short: str) -> str:
  return f"{STACK}/block_{layer:03d}/{short}"


def stacked_layers(num_layers: int, stages: int) -> np.ndarray:
  """[S, Lmax] global layer index of each slot, -1 for a padded slot."""
  ranges = pipeline.stage_layer_ranges(num_layers, stages)
  lmax = max(stop - start for start, stop in ranges)
  slots = np.full((stages, lmax), -1, np.int32)
  for s, (start, stop) in enumerate(ranges):
    slots[s, :stop - start] = np.arange(start, stop)
  return slots


def stack_params(flat: dict, slots: np.ndarray, xp=np) -> dict:
  """{mtf name: array} -> {"blocks": {short: [S, Lmax, ...]}, "shared": {name: array}}."""
  blocks = {}
  for short in BLOCK_WEIGHTS:
    like = xp.zeros_like(flat[block_name(0, short)])
    blocks[short] = xp.stack([xp.stack([flat[block_name(int(l), short)] if l >= 0
                                        else like for l in row]) for row in slots])
  return {"blocks": blocks, "shared": {name: flat[name] for name in SHARED}}


def unstack_params(stacked: dict, slots: np.ndarray) -> dict:
  flat = dict(stacked["shared"])
  for short, value in stacked["blocks"].items():
    for s, row in enumerate(slots):
      for slot, layer in enumerate(row):
        if layer >= 0:
          flat[block_name(int(layer), short)] = value[s, slot]
  return flat


def stacked_adafactor():
  """jax_model.adafactor() on the stacked weights, vmapped over [S, Lmax].

  optax's Adafactor is per leaf: it factors the two largest dimensions of the
  leaf's shape (both >= models.ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR) and clips and scales
  by the leaf's whole RMS. On a [S, Lmax, ...] leaf the RMS would be over every layer
  and (for the 1-D norm scales, with S or Lmax >= 128) it would factor the stacked
  axes. vmapped, each slot sees its own [...]-shaped weight, so the statistics,
  factored or not, are the unstacked model's exactly. The shared weights get the
  plain optimizer. Each slot keeps its own step counter (S x Lmax int32s).
  """
  import jax
  import optax
  from tf_tput.systems.jax import model as jax_model

  inner = jax_model.adafactor()
  over_slots = lambda f: jax.vmap(jax.vmap(f))  # noqa: E731

  def init(params):
    return {"blocks": over_slots(inner.init)(params["blocks"]),
            "shared": inner.init(params["shared"])}

  def update(grads, state, params):
    blocks, blocks_state = over_slots(inner.update)(
        grads["blocks"], state["blocks"], params["blocks"])
    shared, shared_state = inner.update(grads["shared"], state["shared"], params["shared"])
    return ({"blocks": blocks, "shared": shared},
            {"blocks": blocks_state, "shared": shared_state})

  return optax.GradientTransformation(init, update)


def pipeline_loss(params: dict, batch: dict, m, stages: int, slots: np.ndarray,
                  mesh, constrain):
  """The mean over micro-batches of model.py's loss, computed by the pipeline.

  batch: {"targets": int32 [M, micro_batch, length], optional "targets_segmentation"}.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import PartitionSpec as P
  from tf_tput.systems.jax import model as jax_model

  S = stages
  M = batch["targets"].shape[0]
  dtype = jnp.dtype(m.activation_dtype)
  valid = jnp.asarray(slots >= 0)
  last = S - 1

  def varying(x):   # a constant as a per-stage value (shard_map's type of what varies)
    return lax.pcast(x, STAGE, to="varying")

  def per_stage(blocks, shared, valid, batch):
    targets = batch["targets"]
    # Variables cast once to the activation dtype, as loss_fn does.
    blocks = {k: v[0].astype(dtype) for k, v in blocks.items()}   # [Lmax, ...]
    # Made per-stage here, outside every cond and scan: the transpose of this pcast is
    # the psum over stages of the shared weights' gradients, and it must run on every
    # stage. Inside a branch only some stages take, it would deadlock.
    shared = {k: varying(v.astype(dtype)) for k, v in shared.items()}
    valid = valid[0]
    stage = lax.axis_index(STAGE)
    sequence_ids = sequence_id_of(batch, "targets", targets, jnp.minimum)

    def layer(x, weights_and_valid, nonpadding, bias):
      """One block of jax_model._stack: norm, mask, attention, residual; norm, mask,
      feed-forward, residual. A padded slot (valid False) is skipped."""
      w, is_layer = weights_and_valid

      def run(x):
        h = jax_model._rms_norm(x, w["layer_000/rms_norm/scale"]) * nonpadding
        x = x + jax_model._attention(w, "layer_000/SelfAttention", h, h, bias, m,
                                     constrain)
        h = jax_model._rms_norm(x, w["layer_001/rms_norm/scale"]) * nonpadding
        return x + jax_model._dense_relu_dense(w, "layer_001/DenseReluDense", h,
                                               constrain)
      return lax.cond(is_layer, run, lambda x: x, x), None

    def iteration(carry, t):
      received, loss_sum = carry
      index = t - stage                 # the micro-batch this stage has at t
      active = (index >= 0) & (index < M)
      i = jnp.clip(index, 0, M - 1)
      targets_i = targets[i]
      sequence_id = sequence_ids[i]
      nonpadding = (sequence_id != 0).astype(dtype)[:, :, None]

      def embed():
        inputs = jax_model.autoregressive_inputs(targets_i, sequence_id)
        return jax_model._embed(shared[EMBEDDING], inputs, constrain, m.embedding)
      x = lax.cond(active & (stage == 0), embed, lambda: received)

      def run_layers(x):
        bias = jax_model._self_attention_bias(shared, STACK, sequence_id, True, m, dtype)
        x, _ = lax.scan(lambda x, wv: layer(x, wv, nonpadding, bias), x, (blocks, valid))
        return x
      y = lax.cond(active, run_layers, lambda x: x, x)   # the bubble does no work

      def loss(y):
        y = jax_model._rms_norm(y, shared[FINAL_NORM]) * nonpadding
        return jax_model._loss(shared[EMBEDDING], y, targets_i, constrain).astype(
            jnp.float32)
      loss_sum = loss_sum + lax.cond(active & (stage == last), loss,
                                     lambda y: varying(jnp.zeros((), jnp.float32)), y)
      sent = lax.ppermute(y, STAGE, [(s, s + 1) for s in range(S - 1)])
      return (sent, loss_sum), None

    micro_batch, length = targets.shape[1:]
    start = varying(jnp.zeros((micro_batch, length, m.d_model), dtype))
    zero = varying(jnp.zeros((), jnp.float32))
    (_, loss_sum), _ = lax.scan(jax.checkpoint(iteration), (start, zero),
                                jnp.arange(M + S - 1))
    return lax.psum(loss_sum, STAGE) * (1.0 / M)

  # Only the manual axis appears in the specs; the in-stage axes keep the shardings
  # the arguments have (jit's in_shardings).
  in_specs = ({k: P(STAGE) for k in params["blocks"]}, {k: P() for k in SHARED},
              P(STAGE), {k: P() for k in batch})
  return jax.shard_map(per_stage, mesh=mesh, in_specs=in_specs, out_specs=P(),
                       axis_names={STAGE})(params["blocks"], params["shared"], valid,
                                           batch)


def link_bytes(experiment, num_islands: int):
  """Bytes a step sends between islands when tf_tput.launch --islands splits the
  stages across them (S/K each, in order; JAX processes are process-major), or None
  on one island. At each of the K-1 boundaries on a link, every one of the M+S-1 loop
  iterations sends a micro-batch's activations forward (the ppermute runs in the
  bubble too, on what the stage holds) and its transpose sends their gradient back.
  The shared weights' gradients (embedding, relative bias, final norm) are summed
  over the stages by one all-reduce per in-stage device, a ring over the S stages in
  order (gloo's), of that device's shard in the activation dtype (the pcast is after
  the cast): reduction.ring_link_bytes. The scalar loss's psum is not counted."""
  if num_islands < 2:
    return None
  m, p, d = experiment.model, experiment.pipeline, experiment.data
  S, M = p.stages, p.micro_batches
  act = models.activation_bytes_per_element(m.activation_dtype)
  devices = mesh_size(experiment.mesh_shape)  # one stage's; each sends its own shard

  def laid_out_bytes(dims):  # over the stage's devices, replicated copies included
    return models.sharded_size(dims, experiment.mesh_shape, experiment.layout) * (
        devices * act)
  boundary = laid_out_bytes([("batch", experiment.train.global_batch // M),
                             ("length", d.targets_length), ("d_model", m.d_model)])
  variables = {v.name: v for v in models.variables(m)}
  shared = sum(laid_out_bytes(variables[name].dims) for name in SHARED)
  return ((num_islands - 1) * 2 * (M + S - 1) * boundary
          + reduction.ring_link_bytes(shared, S, num_islands))


class JaxPipelineTrainer(systems.Trainer):
  """JaxTrainer's interface over a pipeline: stacked weights sharded over 'stage'."""
  synchronous_step = False  # dispatch() leaves the loss on the device, pending
  compiles_ahead = True     # compile(): the loop's first batch, timed as compile_s

  def __init__(self, experiment, topology):
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tf_tput.systems.jax import model as jax_model

    self._jax = jax
    m, p = experiment.model, experiment.pipeline
    pipeline.validate(experiment)
    S, M = p.stages, p.micro_batches
    self._micro_batches = M
    mesh_shape, layout = experiment.mesh_shape, experiment.layout
    self.analytic_link_bytes_per_step = link_bytes(experiment, topology.islands)
    groups = pipeline.stage_devices(jax.devices(), S)
    self._mesh = Mesh(np.stack([device_mesh(tuple(mesh_shape.values()), g)
                                for g in groups]), (STAGE, *mesh_shape))
    self._slots = slots = stacked_layers(m.num_layers, S)
    variables = {v.name: v for v in models.variables(m)}

    def spec(name):
      return partition_spec([n for n, _ in variables[name].dims], layout, mesh_shape)

    def named(spec):
      return NamedSharding(self._mesh, spec)

    self._param_shardings = {
        "blocks": {k: named(P(STAGE, None, *spec(block_name(0, k))))
                   for k in BLOCK_WEIGHTS},
        "shared": {k: named(spec(k)) for k in SHARED}}
    # A micro-batch's rows are split by the layout's batch axis inside each stage.
    self._batch_sharding = named(P(None, *partition_spec(("batch", "length"), layout,
                                                         mesh_shape)))
    replicated = named(P())

    def constrain(x, dim_names):
      # Inside the shard_map the in-stage axes are automatic: a sharding over them on
      # the abstract mesh shard_map sets (where 'stage' is manual).
      return jax.lax.with_sharding_constraint(x, NamedSharding(
          jax.sharding.get_abstract_mesh(), partition_spec(dim_names, layout, mesh_shape)))

    self._optimizer = stacked_adafactor()
    self._init_params = jax.jit(
        lambda: stack_params(jax_model.init_params(m, experiment.train.seed), slots,
                             jax.numpy),
        out_shardings=self._param_shardings)
    self._params = self._init_params()
    self.num_params = models.num_params(m)   # the model's, padding slots not counted

    def state_sharding(path, leaf):
      """Stacked slots: like their weight where shaped like it, else by stage
      (factored rows / columns, counters). Shared: as JaxTrainer."""
      keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
      group = keys[0]
      name = next((k for k in keys[1:] if k in self._param_shardings[group]), None)
      if name and leaf.shape == shapes[group][name]:
        return self._param_shardings[group][name]
      return named(P(STAGE)) if group == "blocks" else replicated

    shapes = jax.tree.map(lambda v: v.shape, self._params)
    state_shardings = jax.tree_util.tree_map_with_path(
        state_sharding, jax.eval_shape(self._optimizer.init, self._params))
    self._state_shardings = state_shardings
    self._init_state = jax.jit(self._optimizer.init, out_shardings=state_shardings)
    self._opt_state = self._init_state(self._params)

    def loss(params, batch):
      return pipeline_loss(params, batch, m, S, slots, self._mesh, constrain)
    self.loss = loss

    def train_step(params, opt_state, batch):
      value, grads = jax.value_and_grad(loss)(params, batch)
      updates, opt_state = self._optimizer.update(grads, opt_state, params)
      params = jax.tree.map(lambda p, u: p + u, params, updates)
      return params, opt_state, value

    self.train_step = train_step
    self._step = jax.jit(
        train_step, donate_argnums=(0, 1),
        in_shardings=(self._param_shardings, state_shardings, self._batch_sharding),
        out_shardings=(self._param_shardings, state_shardings, replicated))

  def micro_batches(self, batch: dict) -> dict:
    """[B, ...] numpy -> [M, B/M, ...]: micro-batch i is rows i*B/M .. (i+1)*B/M."""
    return {k: np.asarray(v).reshape(self._micro_batches, -1, *np.shape(v)[1:])
            for k, v in batch.items()}

  def global_batch(self, batch: dict) -> dict:
    return {k: self._jax.make_array_from_callback(v.shape, self._batch_sharding,
                                                  lambda index, v=v: v[index])
            for k, v in self.micro_batches(batch).items()}

  def lower(self, batch: dict):
    """The jitted step lowered for this batch (compile() compiles it ahead)."""
    return self._step.lower(self._params, self._opt_state, self.global_batch(batch))

  def compile(self, batch: dict) -> None:
    """Compiles the step ahead of the first (the loop times it); the step runs that
    executable from then on. Once only (a later loop finds it compiled)."""
    if hasattr(self._step, "lower"):
      self._step = self.lower(batch).compile()

  def dispatch(self, batch: dict):
    """Starts one step; its loss as an unfetched jax.Array (float() waits for it)."""
    self._params, self._opt_state, loss = self._step(
        self._params, self._opt_state, self.global_batch(batch))
    return loss.addressable_data(0)

  def step(self, batch: dict) -> float:
    return float(self.dispatch(batch))

  def load_variables(self, values: dict) -> None:
    """Stacks {mtf name: value} onto the stages and resets Adafactor."""
    expected = {block_name(int(l), k) for k in BLOCK_WEIGHTS
                for l in self._slots.flat if l >= 0} | set(SHARED)
    check_variable_names(expected, values)
    stacked = stack_params({k: np.asarray(v, np.float32) for k, v in values.items()},
                           self._slots)
    self._params = self._jax.tree.map(
        lambda v, sharding: self._jax.make_array_from_callback(
            v.shape, sharding, lambda index: v[index]),
        stacked, self._param_shardings)
    self._opt_state = self._init_state(self._params)

  def export_variables(self) -> dict:
    """{mtf name: numpy value}, the unstacked model's names and shapes."""
    host = self._jax.tree.map(lambda v: np.asarray(self._jax.device_get(v)), self._params)
    return unstack_params(host, self._slots)

  @property
  def params(self):
    return self._params

  @property
  def opt_state(self):
    return self._opt_state

  @property
  def mesh(self):
    return self._mesh

  def device_memory_bytes(self) -> Optional[int]:
    return local_peak_bytes(self._jax)

  def close(self) -> None:
    self._params = self._opt_state = None
