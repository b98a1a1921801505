"""--system=mtf's GPipe pipeline (systems/tensorflow/mtf/pipeline.py) on 4 virtual CPU
devices: from the unpipelined trainer's weights it trains the same function (step 0 and 10
Adafactor steps), with the unpipelined variables, each stage's on its own devices."""

import dataclasses
import itertools
import os
import subprocess
import sys

import pytest

from tf_tput import config, data, models, pipeline
from tf_tput.errors import UsageError
from tf_tput.runtime import topology as topology_lib
from tf_tput.systems.tensorflow import runtime as tf_runtime

STEPS = 10
STEP0_RTOL = 1e-5
TRAINING_RTOL = 1e-3
COMMON = ("TrainConfig.global_batch = 8", "DataConfig.targets_length = 32",
          "PipelineConfig.micro_batches = 4")
# S = 2 on decoder_tiny's 2 layers (1 + 1); S = 4 needs 6 layers (1, 2, 2, 1: with
# the embedding and softmax as units, 4 layers would leave the end stages none).
CASES = {
    "s2": (("PipelineConfig.stages = 2", "MeshConfig.mesh_shape = 'batch:2'"),
           "batch:4"),
    "s4": (("PipelineConfig.stages = 4", "MeshConfig.mesh_shape = 'batch:1'",
            "ModelConfig.num_layers = 6"), "batch:1"),
}


def _experiment(params):
  return config.load_experiment(["gin/models/decoder_tiny.gin"], list(params))


# TensorFlow fixes a process's virtual CPU devices when it starts. Under scripts/test.sh
# another test in the same xdist worker has usually started it (with fewer than 4), so
# then this module runs again in a fresh pytest process and each test here asserts
# its outcome there. FRESH marks that process: it never starts another.
FRESH = "TF_TPUT_TEST_FRESH_PROCESS"


@pytest.fixture(scope="module")
def devices4():
  """This process's 4 virtual CPU devices, or None where TF already runs with fewer."""
  try:
    return tf_runtime.RUNTIME.resolve(4)
  except RuntimeError as e:  # TF already started in this process with other devices
    import tensorflow as tf
    names = tuple(d.name for d in tf.config.list_logical_devices("CPU"))
    if len(names) >= 4:
      return topology_lib.Topology("tf", "cpu", names[:4], "cpu")
    if os.environ.get(FRESH):
      pytest.fail(f"needs 4 virtual CPU devices; TF already runs with {names}: {e}")
    return None


@pytest.fixture(scope="module")
def fresh_outcomes(devices4):
  """None where this process has the 4 devices; else {test id: outcome} of this
  module run in a fresh pytest process."""
  if devices4 is not None:
    return None
  # Without the CPU report's directory (conftest.py): this test counts its CPU.
  env = {k: v for k, v in os.environ.items() if k != "TF_TPUT_TEST_CPU_REPORT"}
  done = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-rA",
                         "-p", "no:cacheprovider", "-p", "no:xdist"],
                        env=dict(env, **{FRESH: "1"}), capture_output=True,
                        text=True, timeout=600, cwd=os.path.dirname(__file__))
  outcomes = {}
  for line in done.stdout.splitlines():
    outcome, _, node = line.partition(" ")
    if outcome in ("PASSED", "FAILED", "ERROR", "SKIPPED"):
      outcomes[node.split(" - ")[0].rsplit("::", 1)[-1]] = outcome
  assert outcomes, done.stdout[-3000:] + done.stderr[-3000:]
  return dict(outcomes, output=done.stdout[-3000:])


@pytest.fixture(autouse=True)
def _here_or_in_a_fresh_process(request, fresh_outcomes):
  if fresh_outcomes is None:
    return
  name = request.node.name
  assert fresh_outcomes.get(name) == "PASSED", (name, fresh_outcomes)
  pytest.skip(f"{name} passed in a fresh process (TF runs here with fewer than 4 "
              "virtual CPU devices)")


@pytest.fixture(scope="module")
def runs(devices4):
  """Per case: the pipelined trainer (left open) and both trainers' losses over
  STEPS shared batches, the pipelined one from the unpipelined one's weights."""
  from tf_tput.systems.tensorflow.mtf import system as mtf
  if devices4 is None:  # they run in a fresh process (fresh_outcomes)
    yield None
    return
  out = {}
  for case, (params, unpipelined_mesh) in CASES.items():
    piped = _experiment(COMMON + params)
    flat = _experiment(COMMON + params[1:] + (
        "PipelineConfig.stages = 1", "PipelineConfig.micro_batches = 1",
        f"MeshConfig.mesh_shape = '{unpipelined_mesh}'"))
    n = flat.num_devices
    baseline = mtf.SYSTEM.build(flat, dataclasses.replace(
        devices4, devices=devices4.devices[:n]))
    trainer = mtf.SYSTEM.build(piped, devices4)
    weights = baseline.export_variables()
    own = trainer.export_variables()
    # Other values first (the same seed may give both the same initial weights), so
    # that training from `weights` below needs load_variables to reach the slices.
    other = {k: 1.5 * v + 0.25 for k, v in weights.items()}
    trainer.load_variables(other)
    loaded = trainer.export_variables()
    trainer.load_variables(weights)
    batches = list(itertools.islice(data.batches(flat), STEPS))
    losses = [(baseline.step(b), trainer.step(b)) for b in batches]
    baseline.close()
    out[case] = dict(experiment=piped, trainer=trainer, weights=weights, own=own,
                     other=other, loaded=loaded, losses=losses)
  yield out
  for run in out.values():
    run["trainer"].close()


def _rel(a, b):
  return abs(a - b) / abs(b)


@pytest.mark.parametrize("case", list(CASES))
def test_pipelined_loss_matches_unpipelined(runs, case):
  losses = runs[case]["losses"]
  diffs = [_rel(piped, flat) for flat, piped in losses]
  print(f"{case}: step-0 rel diff {diffs[0]:.1e}, max over {STEPS} steps "
        f"{max(diffs):.1e}")
  assert diffs[0] < STEP0_RTOL, losses[0]
  assert max(diffs) < TRAINING_RTOL, losses
  assert losses[-1][1] < losses[0][1] - 0.5   # it trains: the updates were compared


@pytest.mark.parametrize("case", list(CASES))
def test_variables_are_the_unpipelined_models_and_load(runs, case):
  run = runs[case]
  expected = {v.name: tuple(size for _, size in v.dims)
              for v in models.variables(run["experiment"].model)}
  assert {k: v.shape for k, v in run["own"].items()} == expected
  assert run["trainer"].num_params == models.num_params(run["experiment"].model)
  for name, value in run["other"].items():   # load_variables took every value
    assert (run["loaded"][name] == value).all(), name


def _device(name):
  import tensorflow as tf
  return tf.DeviceSpec.from_string(name).to_string()


@pytest.mark.parametrize("case", list(CASES))
def test_each_stage_lives_on_its_device_group(runs, case):
  run = runs[case]
  trainer, m = run["trainer"], run["experiment"].model
  S = run["experiment"].pipeline.stages
  lowering = trainer.lowering
  meshes = {impl: s for s, impl in enumerate(trainer.mesh_impls)}
  groups = [{_device(d) for d in devices} for devices in trainer.stage_devices]
  assert len(set().union(*groups)) == sum(map(len, groups)) == 4   # disjoint, all
  seen = set()
  for var, laid_out in lowering.variables.items():   # parameters and Adafactor slots
    stage = meshes[lowering.mesh_impl(var)]
    for tensor in laid_out.laid_out_tensor.all_slices:
      assert _device(tensor.device) in groups[stage], (var.name, tensor.device, stage)
    for name in getattr(var, "original_names", None) or [var.name]:
      if name in run["weights"]:
        assert stage == pipeline.variable_stage(name, m.num_layers, S), name
        seen.add(name)
  assert seen == set(run["weights"])
  # Activations forward M (S-1) times, the shared bias and embedding once per stage
  # that reads them; each transfer has its gradient's transfer back.
  from tf_tput.systems.tensorflow.mtf.pipeline import StageTransfer
  M = run["experiment"].pipeline.micro_batches
  transfers = [op for op in lowering.graph.operations if isinstance(op, StageTransfer)]
  assert len(transfers) == 2 * (M * (S - 1) + (S - 1) + 1)


def test_tpu_path_refuses_a_pipeline():
  from tf_tput.systems.tensorflow.mtf import system as mtf
  experiment = _experiment(COMMON + CASES["s2"][0])
  tpu = topology_lib.Topology("tf", "tpu", tuple(f"/device:TPU:{i}" for i in range(4)),
                              "TPU v3")
  with pytest.raises(UsageError, match="does not pipeline"):
    mtf.SYSTEM.build(experiment, tpu)


def test_packed_rows_pipeline_to_the_same_loss(devices4):
  """Several examples per row (targets_segmentation): every stage masks by it."""
  import numpy as np
  from tf_tput.systems.tensorflow.mtf import system as mtf
  packed = ("DataConfig.pack = True", "DataConfig.source = 'tfds'",
            "DataConfig.tfds_name = 'lm1b'")
  params, _ = CASES["s2"]
  piped = _experiment(COMMON + packed + params)
  flat = _experiment(COMMON + packed + ("MeshConfig.mesh_shape = 'batch:4'",
                                        "PipelineConfig.micro_batches = 1"))
  rng = np.random.default_rng(2)
  features = data.features_of(flat)

  def examples():
    while True:
      yield {k: list(rng.integers(3, 259, int(rng.integers(3, 20)))) + [data.EOS_ID]
             for k in features}
  rows = data._pack(examples(), features, data.lengths_of(flat))
  batch = next(data._stack_rows(rows, flat.train.global_batch))
  assert batch["targets_segmentation"].max() > 2
  baseline, trainer = mtf.SYSTEM.build(flat, devices4), mtf.SYSTEM.build(piped, devices4)
  try:
    trainer.load_variables(baseline.export_variables())
    for _ in range(2):   # the loss, then the loss after one update
      flat_loss, piped_loss = baseline.step(batch), trainer.step(batch)
      assert _rel(piped_loss, flat_loss) < STEP0_RTOL
  finally:
    baseline.close()
    trainer.close()
