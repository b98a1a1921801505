"""tf_tput/systems/torch/model.py against jax_model (checked against mtf itself,
tests/unit/test_jax_model.py): the same weights and batch give the same loss and
gradients in float32 and bfloat16 with either embedding, and mtf's Adafactor gives
optax.adafactor's update. The torch System's refusals. Launched processes and the
parity CLI: tests/e2e/test_torch_cli.py."""

import itertools
import shutil
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tf_tput import config, data, models, systems  # noqa: E402
from tf_tput.errors import UsageError  # noqa: E402
from tf_tput.runtime import launchers  # noqa: E402
from tf_tput.systems.torch import runtime as torch_runtime  # noqa: E402
from tf_tput.systems.torch import system as torch_system, model as torch_model  # noqa: E402
from tf_tput.systems.torch.trainer import TorchTrainer  # noqa: E402

# d_model 128 and 8 heads: embedding, q/k/v/o and wi/wo are factored by Adafactor.
FACTORED = ("ModelConfig.d_model = 128", "ModelConfig.num_heads = 8")


def _experiment(name: str, dtype: str = "float32", embedding: str = "one_hot",
                params=()):
  return config.load_experiment([name], [f"ModelConfig.activation_dtype = '{dtype}'",
                                         f"ModelConfig.embedding = '{embedding}'",
                                         *params])


def _same_params(m):
  """jax_model's initial values, as jax arrays and as torch tensors."""
  from tf_tput.systems.jax import model as jax_model
  params = jax_model.init_params(m, seed=0)
  return params, {k: torch.tensor(np.asarray(v)) for k, v in params.items()}


def _torch_batch(batch: dict) -> dict:
  return {k: torch.as_tensor(v) for k, v in batch.items()}


def _jax_value_and_grad(m):
  """jax_model's loss and gradients, jitted (one compilation, not one per op)."""
  import jax
  from tf_tput.systems.jax import model as jax_model
  return jax.jit(jax.value_and_grad(jax_model.loss_fn), static_argnums=2)


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
@pytest.mark.parametrize("embedding", ["one_hot", "gather"])
def test_float32_loss_and_gradients_match_jax_model(name, embedding):
  experiment = _experiment(name, "float32", embedding)
  m = experiment.model
  jax_params, torch_params = _same_params(m)
  batch = next(data.batches(experiment))
  expected_loss, expected = _jax_value_and_grad(m)(jax_params, batch, m)
  for value in torch_params.values():
    value.requires_grad_(True)
  loss = torch_model.loss_fn(torch_params, _torch_batch(batch), m)
  assert loss.dtype == torch.float32 and loss.shape == ()
  assert loss.item() == pytest.approx(float(expected_loss), rel=1e-6)  # rounding only
  names = sorted(torch_params)
  grads = torch.autograd.grad(loss, [torch_params[k] for k in names])
  for name_, grad in zip(names, grads, strict=True):
    want = np.asarray(expected[name_])
    scale = max(np.abs(want).max(), 1e-12)
    assert np.abs(grad.numpy() - want).max() <= 1e-4 * scale, name_


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
@pytest.mark.parametrize("embedding", ["one_hot", "gather"])
def test_bfloat16_loss_matches_jax_model_to_its_precision(name, embedding):
  """mtf (and so jax_model) computes and sums the loss in bfloat16: one ulp."""
  import jax
  from tf_tput.systems.jax import model as jax_model
  experiment = _experiment(name, "bfloat16", embedding)
  m = experiment.model
  jax_params, torch_params = _same_params(m)
  batch = next(data.batches(experiment))
  expected = float(jax.jit(jax_model.loss_fn, static_argnums=2)(jax_params, batch, m))
  loss = torch_model.loss_fn(torch_params, _torch_batch(batch), m)
  assert loss.dtype == torch.float32
  assert float(loss) == pytest.approx(expected, rel=2 ** -7)


def test_adafactor_matches_optax_over_two_steps():
  """Unfactored, factored (the two largest dimensions >= 128) and 3-D shapes."""
  import jax
  import jax.numpy as jnp
  import optax
  from tf_tput.systems.jax import model as jax_model
  rng = np.random.default_rng(0)
  shapes = {"vector": (7,), "small": (3, 5), "factored": (128, 160),
            "tall": (300, 128), "three_d": (4, 130, 128), "one_large": (2, 256)}
  values = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  grads = [{k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
           for _ in range(2)]
  optimizer = jax_model.adafactor()
  jax_params = {k: jnp.asarray(v) for k, v in values.items()}
  state = optimizer.init(jax_params)
  update = jax.jit(optimizer.update)
  torch_params = {k: torch.tensor(v) for k, v in values.items()}
  adafactor = torch_model.Adafactor(torch_params)
  assert set(adafactor.slots["factored"]) == {"vr", "vc"}
  assert set(adafactor.slots["small"]) == {"v"}
  for grad in grads:
    updates, state = update({k: jnp.asarray(g) for k, g in grad.items()}, state,
                            jax_params)
    jax_params = optax.apply_updates(jax_params, updates)
    adafactor.update(torch_params, {k: torch.tensor(g) for k, g in grad.items()})
    for k in shapes:
      change = np.asarray(jax_params[k]) - values[k]
      got = torch_params[k].numpy() - values[k]
      assert np.abs(got - change).max() <= 1e-5 * np.abs(change).max(), k
  assert float(adafactor.step) == 2.0


def test_trainer_matches_jax_over_three_factored_steps():
  """TorchTrainer (its loss, gradients and Adafactor in the loop) against jax_model
  with optax from the same weights, on batches that train a factored model."""
  import jax
  import optax
  from tf_tput.systems.jax import model as jax_model
  experiment = _experiment("decoder_tiny", params=FACTORED)
  m = experiment.model
  jax_params, _ = _same_params(m)
  trainer = TorchTrainer(experiment)
  trainer.load_variables({k: np.asarray(v) for k, v in jax_params.items()})
  optimizer = jax_model.adafactor()
  state = optimizer.init(jax_params)

  @jax.jit
  def jax_step(params, state, batch):
    loss, grads = jax.value_and_grad(jax_model.loss_fn)(params, batch, m)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  try:
    for batch in itertools.islice(data.batches(experiment), 3):
      jax_params, state, expected = jax_step(jax_params, state, batch)
      assert trainer.step(batch) == pytest.approx(float(expected), rel=1e-5)
    exported = trainer.export_variables()
    assert sorted(exported) == sorted(v.name for v in models.variables(m))
    assert trainer.num_params == models.num_params(m)
    for k, v in exported.items():
      assert v.dtype == np.float32
      np.testing.assert_allclose(v, np.asarray(jax_params[k]), rtol=1e-3, atol=1e-5)
    assert trainer.device_memory_bytes() is None  # on the CPU
  finally:
    trainer.close()


def test_init_params_follow_mtf_initializers():
  m = _experiment("t5_tiny").model
  params = torch_model.init_params(m, seed=0)
  again = torch_model.init_params(m, seed=0)
  assert [(k, tuple(v.shape)) for k, v in params.items()] == [
      (v.name, tuple(s for _, s in v.dims)) for v in models.variables(m)]
  assert all(torch.equal(params[k], again[k]) for k in params)  # seeded
  assert torch.all(params["encoder/rms_norm/scale"] == 1.0)
  kernel = params["encoder/block_000/layer_001/DenseReluDense/wi/kernel"]
  limit = 2 * m.d_model ** -0.5  # truncated at 2 stddev
  assert kernel.abs().max() <= limit and kernel.std() > 0.5 * m.d_model ** -0.5
  assert float(params["shared/embedding"].std()) == pytest.approx(1.0, rel=0.05)


def test_system_is_registered_and_data_parallel_only():
  system = systems.load("torch")
  assert (system.name, system.runtime.name, system.multi_process, system.pipelines,
          system.strategies, system.every_worker, system.islands) == (
      "torch", "torch", True, False, ("local",), False, ("data",))
  assert system.embeddings == ("one_hot", "gather")
  system.check(config.load_experiment(["t5_tiny", "data2"], []), "local")
  with pytest.raises(UsageError, match="--system=mtf or --system=jax") as raised:
    system.check(config.load_experiment(["t5_tiny", "data2_model2"], []), "local")
  assert "\n" not in str(raised.value) and "model:2" in str(raised.value)


def test_scan_layers_is_refused_in_one_line():
  experiment = config.load_experiment(["t5_tiny"], ["ModelConfig.scan_layers = True"])
  with pytest.raises(UsageError, match="scan_layers") as raised:
    systems.check_strategy("torch", "local", experiment)
  assert "\n" not in str(raised.value)


def test_compile_without_a_compiler_is_one_line(monkeypatch):
  experiment = config.load_experiment(["t5_tiny"], ["TorchOptions.compile = True"])
  monkeypatch.setenv("CXX", "no-such-compiler-here")
  with pytest.raises(UsageError, match="no-such-compiler-here") as raised:
    systems.load("torch").check(experiment, "local")
  assert "\n" not in str(raised.value)
  monkeypatch.delenv("CXX")
  if shutil.which(torch_system.cxx_compiler()):  # g++ found: accepted
    systems.load("torch").check(experiment, "local")


def test_more_than_one_cpu_device_per_process_is_refused():
  with pytest.raises(UsageError, match="--num_processes") as raised:
    torch_runtime.RUNTIME.resolve(num_cpu_devices=2)
  assert "\n" not in str(raised.value)


@pytest.mark.loopback_ports  # binds the coordinator's port (tests/conftest.py)
def test_a_process_that_never_joins_times_out_naming_the_coordinator():
  import torch.distributed as dist
  with socket.socket() as probe:  # a free loopback port
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  coordinator = f"127.0.0.1:{port}"
  with pytest.raises(TimeoutError, match="--cluster_timeout_s=1") as raised:
    torch_runtime.join_processes(
        dist, launchers.Launch("tf_tput.launch", 2, 0, coordinator=coordinator), "gloo",
        timeout_s=1.0)
  assert coordinator in str(raised.value)
  assert not dist.is_initialized()
