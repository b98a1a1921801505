"""tf_tput/systems/tensorflow/tf2/system.py (its model.py under a strategy) against
mesh_tensorflow itself: the mtf trainer's initial weights loaded into the TF2 trainer
give mtf's loss at step 0 and over 10 Adafactor steps on one device (mtf's runs:
tests/mtf_references.py). Replicas: tests/integration/test_tf2_strategy.py."""

import functools
import itertools

import numpy as np
import pytest

import mtf_references
from tf_tput import config, data, models, systems
from tf_tput.errors import UsageError
from tf_tput.runtime.topology import Topology
from tf_tput.systems.tensorflow.tf2 import system as tf2

STEPS, FACTORED = mtf_references.STEPS, mtf_references.FACTORED
STEP0_RTOL = 1e-5        # float32, same weights and batch
TRAINING_RTOL = 1e-3     # float32, every one of STEPS optimizer steps
ONE_CPU = Topology("tf", "cpu", ("/device:CPU:0",), "cpu")


def _experiment(name: str, params=()):
  return config.load_experiment([f"gin/models/{name}.gin"], list(params))


def _rel(a: float, b: float) -> float:
  return abs(a - b) / abs(b)


@functools.lru_cache(maxsize=None)
def _training_run(name: str, params: tuple = ()) -> dict:
  """STEPS steps of the tf2 trainer, mtf's initial weights loaded, on the batches of
  the mtf reference run (the session's, tests/mtf_references.py)."""
  experiment = _experiment(name, params)
  reference = mtf_references.training_run(name, params, STEPS)
  trainer = tf2.SYSTEM.build(experiment, ONE_CPU)
  try:
    trainer.load_variables(reference.initial)
    batches = list(itertools.islice(data.batches(experiment), STEPS))
    return {"mtf": list(reference.losses), "tf2": [trainer.step(b) for b in batches],
            "num_params": trainer.num_params,
            "exported": sorted(trainer.export_variables())}
  finally:
    trainer.close()


# Factored first: test_jax_model.py asks for t5_tiny's reference first, so when the two
# files start side by side in two xdist workers each computes a different one.
@pytest.mark.parametrize("name,params", [("decoder_tiny", FACTORED), ("decoder_tiny", ()),
                                         ("t5_tiny", ())],
                         ids=["decoder_tiny_factored", "decoder_tiny", "t5_tiny"])
def test_ten_adafactor_steps_match_mtf(name, params):
  run = _training_run(name, params)
  diffs = [_rel(b, a) for a, b in zip(run["mtf"], run["tf2"], strict=True)]
  print(f"{name}{params} step-0 rel {diffs[0]:.2e}, max over {STEPS} steps "
        f"{max(diffs):.2e}")
  assert diffs[0] < STEP0_RTOL
  assert len(diffs) == STEPS and max(diffs) < TRAINING_RTOL, list(zip(run["mtf"],
                                                                       run["tf2"], strict=True))
  assert run["mtf"][-1] < run["mtf"][0] - 0.5   # it trains, so the updates were compared


@pytest.mark.parametrize("name", ["t5_tiny", "decoder_tiny"])
def test_variables_are_mtfs(name):
  run = _training_run(name, ())
  m = _experiment(name).model
  assert run["exported"] == sorted(v.name for v in models.variables(m))
  assert run["num_params"] == models.num_params(m)


def test_bfloat16_step0_loss_matches_mtf_to_its_precision():
  """mtf computes and sums the loss in bfloat16: agreement is to one bfloat16 ulp."""
  from tf_tput.systems.tensorflow.mtf import system as mtf
  experiment = _experiment("decoder_tiny", ["ModelConfig.activation_dtype = 'bfloat16'"])
  batch = next(data.batches(experiment))
  reference = mtf.SYSTEM.build(experiment, Topology("tf", "cpu", ("",), "cpu"))
  trainer = tf2.SYSTEM.build(experiment, ONE_CPU)
  trainer.load_variables(reference.export_variables())
  expected, got = reference.step(batch), trainer.step(batch)
  reference.close()
  trainer.close()
  assert abs(got - expected) <= 2.0 ** (np.floor(np.log2(expected)) - 7)


def test_gather_embedding_gives_the_one_hot_loss():
  losses = []
  weights = None
  for embedding in ("one_hot", "gather"):
    experiment = _experiment("decoder_tiny", [f"ModelConfig.embedding = '{embedding}'"])
    trainer = tf2.SYSTEM.build(experiment, ONE_CPU)
    if weights is None:
      weights = trainer.export_variables()
    trainer.load_variables(weights)
    losses.append(trainer.step(next(data.batches(experiment))))
    trainer.close()
  assert _rel(losses[1], losses[0]) < 1e-6


def test_adafactor_slots_are_mtfs():
  """Factored exactly where mtf factors (models.adafactor_slot_dims), over its dims."""
  from tf_tput.systems.tensorflow.tf2 import model as tf2_model
  m = _experiment("decoder_tiny", FACTORED).model
  for v in models.variables(m):
    shape = tuple(size for _, size in v.dims)
    slots = tf2_model.Adafactor.slot_shapes(shape)
    expected = [tuple(size for _, size in dims) for dims in models.adafactor_slot_dims(v)]
    assert sorted(slots.values()) == sorted(expected), v.name


def test_adafactor_learning_rate_and_decay_follow_mtf_step():
  from tf_tput.systems.tensorflow.tf2 import model as tf2_model
  assert float(tf2_model.learning_rate(0)) == pytest.approx(0.01)
  assert float(tf2_model.learning_rate(20000)) == pytest.approx(20001 ** -0.5)
  assert float(tf2_model.decay_rate(0)) == 0.0
  assert float(tf2_model.decay_rate(9)) == pytest.approx(1 - 10 ** -0.8)


def test_system_is_registered_and_data_parallel_only():
  system = systems.load("tf2")
  assert (system.name, system.runtime.name, system.multi_process, system.pipelines,
          system.strategies, system.every_worker) == (
      "tf2", "tf", True, False, ("local", "multi_worker", "tpu"), True)
  assert system.embeddings == ("one_hot", "gather")
  tf2.check_mesh(config.load_experiment(["gin/models/t5_tiny.gin", "gin/mesh/data2.gin"],
                                        []))
  experiment = config.load_experiment(
      ["gin/models/t5_tiny.gin", "gin/mesh/data2_model2.gin"], [])
  with pytest.raises(UsageError, match="--system=mtf or --system=jax") as raised:
    tf2.check_mesh(experiment)
  assert "\n" not in str(raised.value) and "model:2" in str(raised.value)
