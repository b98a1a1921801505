"""tf_tput/systems/jax/pipeline.py: the GPipe pipeline trains as the unpipelined
JaxTrainer does, from the same weights; its compiled step loops M+S-1 times and keeps
each stage's layer weights and Adafactor state on that stage's devices.

The pipelined runs need 4 devices in one process, so they run in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (this file, run as a script) and
report back as JSON; the tests check the report.
"""

import itertools
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from tf_tput import REPO_ROOT  # noqa: E402

STEPS = 10
STEP0_RTOL = 1e-5
TRAINING_RTOL = 1e-3
DEVICES = 4
# (stages, per-stage mesh, layers). decoder_tiny's 2 layers cannot fill 4 stages:
# 6 layers split 1, 2, 2, 1 (stages 0 and 3 each have a padded slot); 4 layers, 2, 2.
CASES = {"s2_batch2": (2, "batch:2", 4), "s4_batch1": (4, "batch:1", 6)}
MICRO_BATCHES = 4
BASE = ("TrainConfig.global_batch = 8", "DataConfig.targets_length = 32")
COLLECTIVE = re.compile(
    r"= (?P<shape>.*?) (?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|"
    r"collective-permute)(?:-start)?\(")


def _experiment(stages, mesh, layers):
  from tf_tput import config
  params = list(BASE) + [f"ModelConfig.num_layers = {layers}",
                         f"MeshConfig.mesh_shape = '{mesh}'"]
  if stages > 1:
    params += [f"PipelineConfig.stages = {stages}",
               f"PipelineConfig.micro_batches = {MICRO_BATCHES}"]
  return config.load_experiment(["gin/models/decoder_tiny.gin"], params)


def _groups(line: str) -> list:
  """The device groups of one HLO collective: replica_groups (listed or iota) or a
  collective-permute's source-target pairs."""
  pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
  if pairs:
    return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1))]
  iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
  if iota:
    shape = [int(x) for x in iota.group(1).split(",")]
    dims = [int(x) for x in iota.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if iota.group(3):
      ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
    return ids.reshape(shape).tolist()
  listed = re.search(r"replica_groups=\{(.*?)\}(?:,|$)", line)
  if listed and listed.group(1).strip():
    return [[int(x) for x in g.split(",")] for g in re.findall(r"\{([\d,]+)\}",
                                                               listed.group(0))]
  return [list(range(DEVICES))]   # replica_groups={}: every device


def _shapes(text: str) -> list:
  return [tuple(int(x) for x in dims.split(",") if x)
          for dims in re.findall(r"[a-z]+\d*\[([\d,]*)\]", text)]


def _cross_stage_collectives(hlo: str, per_stage: int) -> list:
  """(op, [result shapes]) of every collective whose groups mix stages."""
  found = []
  for line in hlo.splitlines():
    match = COLLECTIVE.search(line)
    if not match:
      continue
    if any(len({d // per_stage for d in group}) > 1 for group in _groups(line)):
      found.append((match.group("op"), _shapes(match.group("shape"))))
  return found


def _scan_lengths(jaxpr, inside_shard_map=False, out=None):
  """Lengths of the scans directly in a shard_map's body (the pipeline loops)."""
  out = [] if out is None else out
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "scan" and inside_shard_map:
      out.append(eqn.params["length"])
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        inner = getattr(sub, "jaxpr", sub)
        inner = getattr(inner, "jaxpr", inner) if not hasattr(inner, "eqns") else inner
        if hasattr(inner, "eqns") and name != "scan":
          _scan_lengths(inner, name == "shard_map", out)
  return out


def _worker(case: str) -> dict:
  """Runs in the 4-device subprocess: unpipelined and pipelined, same weights."""
  from tf_tput import data, models
  from tf_tput.systems.jax import runtime as jax_runtime
  from tf_tput.systems.jax import pipeline as jax_pipeline, system as jax_system
  from tf_tput.systems.jax import trainer as jax_trainer
  stages, mesh, layers = CASES[case]
  reference = _experiment(1, f"batch:{DEVICES}", layers)
  piped = _experiment(stages, mesh, layers)
  m = piped.model
  topology = jax_runtime.RUNTIME.resolve()  # this process's 4 devices, no islands
  trainer = jax_trainer.JaxTrainer(reference, topology)
  weights = trainer.export_variables()
  pipe = jax_system.SYSTEM.build(piped, topology)
  pipe.load_variables(weights)
  exported = pipe.export_variables()
  batches = list(itertools.islice(data.batches(reference), STEPS))

  # The compiled step, before it runs (the step donates its buffers).
  jaxpr = jax.make_jaxpr(pipe.train_step)(pipe.params, pipe.opt_state,
                                          pipe.global_batch(batches[0]))
  # Compiled ahead, as the measured loop does: the steps below run this executable,
  # so the program whose HLO is read is the one that trains (and compiles once).
  pipe.compile(batches[0])
  hlo = pipe._step.as_text()
  per_stage = DEVICES // stages
  stage_of = {d.id: s for s, group in enumerate(pipe.mesh.devices) for d in group.flat}

  def placement(tree):
    """Per stacked leaf: is it sharded over 'stage' and does every shard on stage s's
    devices hold stage s's slice only?"""
    ok = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree["blocks"]):
      on_stage = all(shard.index[0] == slice(stage_of[shard.device.id],
                                             stage_of[shard.device.id] + 1)
                     for shard in leaf.addressable_shards)
      ok[jax.tree_util.keystr(path)] = bool(
          leaf.sharding.spec[0] == jax_pipeline.STAGE and on_stage)
    return ok

  params_placed, state_placed = placement(pipe.params), placement(pipe.opt_state)
  losses = [[trainer.step(b), pipe.step(b)] for b in batches]
  trained = pipe.export_variables()
  padded = {k: float(np.abs(np.asarray(v)[pipe._slots < 0]).max(initial=0.0))
            for k, v in pipe.params["blocks"].items()}
  micro_batch = reference.train.global_batch // MICRO_BATCHES
  batch_shards = piped.mesh_shape.get("batch", 1)
  return {
      "losses": losses,
      "scan_lengths": _scan_lengths(jaxpr.jaxpr),
      "cross_stage": _cross_stage_collectives(hlo, per_stage),
      "activation_shape": [micro_batch // batch_shards, piped.data.targets_length,
                           m.d_model],
      "shared_shapes": [[s for _, s in v.dims] for v in models.variables(m)
                        if v.name in jax_pipeline.SHARED],
      "params_placed": params_placed, "state_placed": state_placed,
      "export_roundtrip": sorted(exported) == sorted(weights) and all(
          np.array_equal(exported[k], weights[k]) for k in weights),
      "export_shapes": {k: list(np.shape(v)) for k, v in trained.items()} == {
          k: list(np.shape(v)) for k, v in weights.items()},
      "padded_slots_max": padded, "num_params": pipe.num_params,
      "model_params": models.num_params(m),
      "slots": pipe._slots.tolist(),
  }


@pytest.fixture(scope="module")
def reports():
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO_ROOT))
  proc = subprocess.run([sys.executable, __file__, *CASES], env=env, cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=400)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_pipelined_losses_match_the_unpipelined_trainer(reports, case):
  losses = reports[case]["losses"]
  assert len(losses) == STEPS
  (ref0, pipe0), diffs = losses[0], [abs(p - r) / r for r, p in losses]
  print(f"{case}: step-0 {ref0!r} vs {pipe0!r}; max rel diff over {STEPS} steps "
        f"{max(diffs):.2e}")
  assert diffs[0] < STEP0_RTOL
  assert max(diffs) < TRAINING_RTOL, losses
  assert losses[-1][0] < losses[0][0] - 0.5   # it trains, so updates were compared


@pytest.mark.parametrize("case", CASES)
def test_the_loop_runs_m_plus_s_minus_1_iterations(reports, case):
  stages = CASES[case][0]
  lengths = reports[case]["scan_lengths"]
  # value_and_grad: the forward shard_map's scan, and the transposed one's.
  assert lengths and set(lengths) == {MICRO_BATCHES + stages - 1}, lengths


@pytest.mark.parametrize("case", CASES)
def test_no_layer_weight_crosses_stages(reports, case):
  """Across stages only: the activations' collective-permutes, and one psum of the
  shared weights' gradients (embedding, relative bias, final norm) and the loss."""
  report = reports[case]
  ops = report["cross_stage"]
  assert {op for op, _ in ops} == {"collective-permute", "all-reduce"}, ops
  for op, shapes in ops:
    if op == "collective-permute":
      assert shapes == [report["activation_shape"]], (op, shapes)
  reduced = [tuple(s) for op, shapes in ops if op == "all-reduce" for s in shapes]
  shared = [tuple(s) for s in report["shared_shapes"]]
  assert set(reduced) <= set(shared) | {()}, reduced
  # Each shared gradient once; a layer weight shaped like one would add to the count.
  assert sorted(s for s in reduced if s) == sorted(shared), reduced


@pytest.mark.parametrize("case", CASES)
def test_stacked_weights_and_adafactor_state_live_on_their_stage(reports, case):
  report = reports[case]
  assert report["params_placed"] and all(report["params_placed"].values()), \
      report["params_placed"]
  assert report["state_placed"] and all(report["state_placed"].values()), \
      report["state_placed"]


@pytest.mark.parametrize("case", CASES)
def test_variables_round_trip_and_padded_slots_stay_zero(reports, case):
  report = reports[case]
  assert report["export_roundtrip"] and report["export_shapes"]
  assert report["num_params"] == report["model_params"]
  if case == "s4_batch1":
    assert report["slots"] == [[0, -1], [1, 2], [3, 4], [5, -1]]
  assert not any(report["padded_slots_max"].values()), report["padded_slots_max"]


def test_stacked_adafactor_is_the_unstacked_optimizer_per_layer():
  """Factored shapes ([128, 256] weights) and 1-D scales: vmapped over [S, Lmax] the
  optimizer's updates and statistics are each layer's own."""
  import jax.numpy as jnp
  from tf_tput.systems.jax import model as jax_model, pipeline as jax_pipeline
  rng = np.random.default_rng(0)
  shapes = {"w": (128, 256), "scale": (128,)}
  params = {k: jnp.asarray(rng.normal(size=(2, 3, *s)), jnp.float32)
            for k, s in shapes.items()}
  grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
  stacked = jax_pipeline.stacked_adafactor()
  state = stacked.init({"blocks": params, "shared": {}})
  for _ in range(2):
    updates, state = stacked.update({"blocks": grads, "shared": {}}, state,
                                    {"blocks": params, "shared": {}})
  plain = jax_model.adafactor()
  for s, l in itertools.product(range(2), range(3)):
    one = {k: v[s, l] for k, v in params.items()}
    g = {k: v[s, l] for k, v in grads.items()}
    one_state = plain.init(one)
    for _ in range(2):
      one_updates, one_state = plain.update(g, one_state, one)
    for k in shapes:
      np.testing.assert_allclose(updates["blocks"][k][s, l], one_updates[k], rtol=1e-6)
    flat = jax.tree.leaves(one_state)
    flat_stacked = [leaf[s, l] for leaf in jax.tree.leaves(state["blocks"])]
    assert [x.shape for x in flat] == [x.shape for x in flat_stacked]
    assert any(x.shape == (128,) for x in flat) and any(x.shape == (256,) for x in flat)
    for a, b in zip(flat, flat_stacked, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6)


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  print(json.dumps({case: _worker(case) for case in sys.argv[1:]}))
