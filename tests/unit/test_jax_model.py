"""tf_tput/systems/jax/model.py against mesh_tensorflow itself: the mtf trainer's
weights and batches through the JAX model give mtf's loss, step 0 and over 10 steps;
and ModelConfig.scan_layers gives the unscanned model's loss, gradients and steps."""

import functools
import itertools
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

import mtf_references  # noqa: E402
from tf_tput import config  # noqa: E402
from tf_tput import data  # noqa: E402
from tf_tput import models  # noqa: E402
from tf_tput.runtime.topology import Topology  # noqa: E402
from tf_tput.systems.jax import model as jax_model  # noqa: E402

jax.config.update("jax_enable_x64", False)

STEPS, FACTORED = mtf_references.STEPS, mtf_references.FACTORED
STEP0_RTOL = 1e-5        # float32, same weights and batch
TRAINING_RTOL = 1e-3     # float32, every one of STEPS optimizer steps
PACKED = ("DataConfig.pack = True", "DataConfig.source = 'tfds'",
          "DataConfig.tfds_name = 'lm1b'")


@pytest.fixture(autouse=True, scope="module")
def _on_cpu():
  """JAX's CPU backend (XLA:CPU computes float32 matmuls in full precision)."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def _experiment(name: str, params=()):
  return config.load_experiment([f"gin/models/{name}.gin"], list(params))


def _mtf_trainer(experiment):
  from tf_tput.systems.tensorflow.mtf import system as mtf
  return mtf.SYSTEM.build(experiment, Topology("tf", "cpu", ("",), "cpu"))


def _rel(a: float, b: float) -> float:
  return abs(a - b) / abs(b)


_jitted_loss = jax.jit(jax_model.loss_fn, static_argnames="m")   # ModelConfig is hashable


def _jax_loss(weights, batch, m):
  return float(_jitted_loss(weights, batch, m=m))


def _packed_batch(experiment, seed: int) -> dict:
  """Examples of 4..50 ids (EOS-terminated) packed by data._pack, as tfds rows are."""
  rng = np.random.default_rng(seed)
  features = data.features_of(experiment)

  def examples():
    while True:
      yield {k: list(rng.integers(3, 259, int(rng.integers(3, 50)))) + [data.EOS_ID]
             for k in features}
  rows = data._pack(examples(), features, data.lengths_of(experiment))
  return next(data._stack_rows(rows, experiment.train.global_batch))


def _training_run(name: str, params: tuple = ()) -> dict:
  return _cached_training_run(name, tuple(params))


@functools.lru_cache(maxsize=None)
def _cached_training_run(name: str, params: tuple) -> dict:
  """STEPS steps of the mtf trainer (the session's shared reference run,
  tests/mtf_references.py) and of a jitted JAX step (value_and_grad(loss_fn),
  adafactor(), apply_updates) from the same initial weights on the same batches; then
  one padded batch at the trained weights."""
  experiment = _experiment(name, params)
  m = experiment.model
  reference = mtf_references.training_run(name, params, STEPS)
  weights = reference.initial
  batches = list(itertools.islice(data.batches(experiment), STEPS))

  optimizer = jax_model.adafactor()

  @jax.jit
  def train_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(jax_model.loss_fn)(params, batch, m)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = {k: jnp.asarray(v) for k, v in weights.items()}
  opt_state = optimizer.init(params)
  jax_losses = []
  for batch in batches:
    params, opt_state, loss = train_step(params, opt_state, batch)
    jax_losses.append(float(loss))

  padded = mtf_references.padded_batch(experiment)
  return {
      "step0_jax": _jax_loss(weights, batches[0], m),
      "mtf": list(reference.losses), "jax": jax_losses,
      "padded_jax": _jax_loss(reference.trained, padded, m),
      "padded_mtf": reference.padded_loss,
  }


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_step0_loss_matches_mtf(name):
  run = _training_run(name)
  diff = _rel(run["step0_jax"], run["mtf"][0])
  print(f"{name} step-0 loss mtf {run['mtf'][0]!r} jax {run['step0_jax']!r} rel {diff:.2e}")
  assert diff < STEP0_RTOL


@pytest.mark.parametrize("name,params", [("t5_tiny", ()), ("decoder_tiny", ()),
                                         ("decoder_tiny", FACTORED)],
                         ids=["t5_tiny", "decoder_tiny", "decoder_tiny_factored"])
def test_ten_adafactor_steps_match_mtf(name, params):
  run = _training_run(name, params)
  diffs = [_rel(j, t) for j, t in zip(run["jax"], run["mtf"], strict=True)]
  print(f"{name}{params} max rel loss diff over {STEPS} steps {max(diffs):.2e}")
  assert len(diffs) == STEPS
  assert max(diffs) < TRAINING_RTOL, list(zip(run["mtf"], run["jax"], strict=True))
  assert run["mtf"][-1] < run["mtf"][0] - 0.5   # it trains, so the updates were compared


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_padded_batch_loss_matches_mtf(name):
  run = _training_run(name)
  assert _rel(run["padded_jax"], run["padded_mtf"]) < STEP0_RTOL


@pytest.mark.parametrize("name", ["decoder_tiny", "t5_tiny"])
def test_packed_batch_loss_matches_mtf(name):
  experiment = _experiment(name, PACKED)
  batch = _packed_batch(experiment, seed=2)
  assert batch["targets_segmentation"].max() > 2   # several examples per row
  trainer = _mtf_trainer(experiment)
  weights = trainer.export_variables()
  expected = trainer.step(batch)
  trainer.close()
  assert _rel(_jax_loss(weights, batch, experiment.model), expected) < STEP0_RTOL


def test_bfloat16_step0_loss_matches_mtf_to_its_precision():
  """mtf computes and sums the loss in bfloat16: agreement is to one bfloat16 ulp."""
  experiment = _experiment("t5_tiny", ["ModelConfig.activation_dtype = 'bfloat16'"])
  batch = next(data.batches(experiment))
  trainer = _mtf_trainer(experiment)
  weights = trainer.export_variables()
  expected = trainer.step(batch)
  trainer.close()
  ulp = 2.0 ** (np.floor(np.log2(expected)) - 7)
  assert abs(_jax_loss(weights, batch, experiment.model) - expected) <= ulp


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets", [32, 13])
def test_relative_position_buckets_match_mtf_lowering(bidirectional, num_buckets):
  import tensorflow as tf
  from tf_tput import compat
  mtf, mtf_transformer = compat.import_mtf()
  relative_position = np.arange(-1000, 1001, dtype=np.int32)
  graph = tf.Graph()
  with graph.as_default():
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    x = mtf.import_tf_tensor(mesh, tf.constant(relative_position),
                             mtf.Shape([mtf.Dimension("length", relative_position.size)]))
    buckets = mtf_transformer.transformer_layers._relative_position_bucket(
        x, bidirectional=bidirectional, num_buckets=num_buckets)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.convert_to_shape("all:1"), mtf.convert_to_layout_rules(""), [""])
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    with tf.compat.v1.Session(graph=graph) as session:
      expected = session.run(lowering.export_to_tf_tensor(buckets))
  np.testing.assert_array_equal(
      jax_model.relative_position_bucket(relative_position, bidirectional, num_buckets),
      expected)


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_init_params_are_mtf_variables_with_mtf_initializers(name):
  m = _experiment(name).model
  params = jax_model.init_params(m, seed=0)
  variables = models.variables(m)
  assert list(params) == [v.name for v in variables]
  for v in variables:
    value = np.asarray(params[v.name])
    assert value.dtype == np.float32
    assert value.shape == tuple(size for _, size in v.dims), v.name
    leaf = v.name.rsplit("/", 1)[-1]
    if leaf == "scale":
      assert (value == 1).all()
    elif leaf == "kernel":     # truncated normal, cut at 2 stddev of fan-in scaling
      assert np.abs(value).max() <= 2 * value.shape[0] ** -0.5
      assert value.std() == pytest.approx(0.88 * value.shape[0] ** -0.5, rel=0.1)
    elif leaf == "relative_attention_bias":   # glorot uniform
      assert np.abs(value).max() <= (6 / sum(value.shape)) ** 0.5
    else:
      stddev = {"embedding": 1.0, "q": (m.d_model * m.d_kv) ** -0.5,
                "k": m.d_model ** -0.5, "v": m.d_model ** -0.5,
                "o": (m.num_heads * m.d_kv) ** -0.5}[leaf]
      assert value.std() == pytest.approx(stddev, rel=0.1), v.name
  changed = jax_model.init_params(m, seed=1)
  assert not np.array_equal(params[variables[0].name], changed[variables[0].name])


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_constrain_sees_named_activations(name):
  experiment = _experiment(name)
  m = experiment.model
  seen = []

  def constrain(x, dim_names):
    assert len(dim_names) == x.ndim
    seen.append(tuple(dim_names))
    return x

  batch = next(data.batches(experiment))
  params = jax_model.init_params(m, seed=0)
  out = jax.eval_shape(lambda p: jax_model.loss_fn(p, batch, m, constrain), params)
  assert out.shape == () and out.dtype == jnp.float32
  assert {("batch", "length", "d_model"), ("batch", "length", "d_ff"),
          ("batch", "length", "heads", "d_kv"), ("batch", "memory_length", "heads", "d_kv"),
          ("batch", "heads", "length", "memory_length"),
          ("batch", "length", "vocab")} == set(seen)


def test_adafactor_learning_rate_and_decay_follow_mtf_step():
  """Update k reads step k: lr min(0.01, rsqrt(k + 1)); update 0 sets v = g^2 + 1e-30."""
  assert float(jax_model._learning_rate(0)) == pytest.approx(0.01)
  assert float(jax_model._learning_rate(20000)) == pytest.approx(20001 ** -0.5)
  optimizer = jax_model.adafactor()
  param = {"w": jnp.full((4,), 2.0)}
  grad = {"w": jnp.array([1.0, -2.0, 3.0, -4.0])}
  updates, _ = optimizer.update(grad, optimizer.init(param), param)
  # sign(g) (|g| / sqrt(g^2) = 1, RMS 1, unclipped) * lr 0.01 * parameter RMS 2.
  np.testing.assert_allclose(updates["w"], -0.02 * np.sign(grad["w"]), rtol=1e-6)


def _compiled_flops(fn, *args) -> tuple:
  """(fn(*args), the FLOPs XLA counts in it), from one compilation."""
  compiled = jax.jit(fn).lower(*args).compile()
  analysis = compiled.cost_analysis()
  return compiled(*args), (analysis[0] if isinstance(analysis, list) else analysis)["flops"]


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_one_hot_embedding_is_mtfs_matmul_and_gather_the_same_values(name):
  """one_hot (the default, mtf.gather's arithmetic) embeds with a matmul over the
  vocabulary, forward and in the embedding's gradient; gather looks rows up. Same loss."""
  runs = {}
  for embedding in config.EMBEDDINGS:
    experiment = _experiment(name, [f"ModelConfig.embedding = '{embedding}'"])
    m = experiment.model
    batch = next(data.batches(experiment))
    params = jax_model.init_params(m, seed=0)
    loss = functools.partial(jax_model.loss_fn, m=m)
    value, forward = _compiled_flops(loss, params, batch)
    runs[embedding] = (float(value), forward,
                       _compiled_flops(jax.grad(loss), params, batch)[1])
  assert _config_default_embedding() == "one_hot"
  tokens = sum(v.size for v in batch.values())
  lookup_as_matmul = 2 * models.padded_vocab(m.vocab_size) * m.d_model * tokens
  (loss_1h, fwd_1h, grad_1h), (loss_g, fwd_g, grad_g) = runs["one_hot"], runs["gather"]
  assert _rel(loss_1h, loss_g) < 1e-6
  # XLA also counts the one-hot's elementwise ops and the relative-bias lookup.
  assert lookup_as_matmul <= fwd_1h - fwd_g <= 1.2 * lookup_as_matmul
  assert grad_1h - grad_g >= 2 * lookup_as_matmul  # forward + the embedding's gradient


def _config_default_embedding() -> str:
  return config.ModelConfig.__dataclass_fields__["embedding"].default


# Two compilations per case are the cost (XLA:CPU), so one case: T5 (two stacks) in
# float32; decoder_tiny in bfloat16 matched bit for bit when checked by hand
# (docs/results/2026-12-05-startup-cache-scan.md). The trainer test below runs
# decoder_tiny in float32.
SCAN_CASES = [("t5_tiny", "float32")]
SCAN_RTOL = {"float32": 1e-5, "bfloat16": 2e-2}   # a few roundings of bfloat16's 2^-8
SHORT = ("DataConfig.inputs_length = 32", "DataConfig.targets_length = 32",
         "TrainConfig.global_batch = 4")


def _scan_pair(name: str, params=()) -> tuple:
  """The same experiment unscanned and with ModelConfig.scan_layers = True."""
  return (_experiment(name, [*SHORT, *params]),
          _experiment(name, [*SHORT, *params, "ModelConfig.scan_layers = True"]))


def _scans(fn, *args) -> int:
  """How many lax.scan the function's jaxpr runs (its text prints nested jaxprs too)."""
  return len(re.findall(r"\bscan\[", str(jax.make_jaxpr(fn)(*args))))


@pytest.mark.parametrize("name, dtype", SCAN_CASES)
def test_scanned_layers_give_the_unscanned_loss_and_gradients(name, dtype):
  plain, scanned = _scan_pair(name, [f"ModelConfig.activation_dtype = '{dtype}'"])
  assert not plain.model.scan_layers and scanned.model.scan_layers
  batch = next(data.batches(plain))
  params = jax_model.init_params(plain.model, seed=0)
  grad = jax.jit(jax.value_and_grad(jax_model.loss_fn), static_argnames="m")
  (loss, grads), (scan_loss, scan_grads) = (grad(params, batch, m=e.model)
                                            for e in (plain, scanned))
  stacks = 2 if name.startswith("t5") else 1   # one scan per stack, none unscanned
  assert [_scans(functools.partial(jax_model.loss_fn, m=e.model), params, batch)
          for e in (plain, scanned)] == [0, stacks]
  rtol = SCAN_RTOL[dtype]
  assert _rel(float(scan_loss), float(loss)) <= rtol
  assert set(scan_grads) == set(grads) == {v.name for v in models.variables(plain.model)}
  for k in grads:   # every per-layer weight, and the shared bias, gets its own gradient
    scale = float(jnp.max(jnp.abs(grads[k])))
    assert scale > 0, k
    np.testing.assert_allclose(scan_grads[k], grads[k], rtol=rtol, atol=rtol * scale,
                               err_msg=k)


def test_scanned_layers_train_as_unscanned_in_the_jax_trainer():
  """JaxTrainer (sharded, jitted, donated) from the same weights on the same batches."""
  from tf_tput.systems.jax.trainer import JaxTrainer
  topology = Topology("jax", "cpu", (str(jax.devices()[0]),), "cpu")
  plain, scanned = _scan_pair("decoder_tiny")
  batches = list(itertools.islice(data.batches(plain), 3))
  trainers = [JaxTrainer(e, topology) for e in (plain, scanned)]
  trainers[1].load_variables(trainers[0].export_variables())
  losses = [[trainer.step(b) for b in batches] for trainer in trainers]
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
  assert losses[0][-1] < losses[0][0]   # it trained
  after = [trainer.export_variables() for trainer in trainers]
  assert set(after[1]) == {v.name for v in models.variables(scanned.model)}
  for k in after[0]:
    np.testing.assert_allclose(after[1][k], after[0][k], rtol=1e-5, atol=1e-7, err_msg=k)
  for trainer in trainers:
    trainer.close()
