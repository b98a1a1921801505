"""tf_tput/systems/jax/islands.py on 4 virtual CPU devices as 2 islands x 2: the same
losses as the flat data-parallel trainer, and a compiled step whose only gradient
traffic across islands is the all-reduce of each island's shard."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

pytest.importorskip("jax")

# Run in a subprocess: the virtual device count is fixed when JAX starts.
SCRIPT = r"""
import dataclasses, itertools, json, re
from tf_tput import config, data
from tf_tput.systems.jax import runtime as jax_runtime
topo = jax_runtime.RUNTIME.resolve(4)
from tf_tput.systems.jax import trainer as jax_trainer
from tf_tput.systems.jax.islands import JaxIslandTrainer
e = config.load_experiment(["gin/models/decoder_tiny.gin"], [
    "MeshConfig.mesh_shape = 'batch:4'", "DataConfig.targets_length = 32"])
flat = jax_trainer.JaxTrainer(e, topo)
islands = JaxIslandTrainer(e, dataclasses.replace(topo, islands=2))
islands.load_variables(flat.export_variables())
batches = list(itertools.islice(data.batches(e), 10))
out = {"flat": [flat.step(b) for b in batches],
       "islands": [islands.step(b) for b in batches]}
arrays = {k: islands._global_array(v) for k, v in batches[0].items()}
hlo = islands._step.lower(islands._params, islands._opt_state, arrays).compile().as_text()
out["collectives"] = re.findall(
    r"= (\S+) (all-reduce|reduce-scatter|all-gather)(?:-start)?\(.*?replica_groups=(\{\{[\d,{}]*\}\})",
    hlo)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def run():
  proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True,
                        text=True, timeout=300,
                        env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
                             "PATH": "/usr/bin:/bin"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.split("RESULT ", 1)[1])


def test_islands_train_the_flat_data_parallel_function(run):
  for step, (flat, islands) in enumerate(zip(run["flat"], run["islands"], strict=True)):
    assert abs(islands - flat) / flat < (1e-5 if step == 0 else 1e-4)


def test_only_each_islands_shard_crosses_between_islands(run):
  """Devices 0,1 are island 0 and 2,3 island 1: the gradient is reduce-scattered and
  all-gathered within islands, its shards all-reduced across; only the scalar loss is
  summed over every device."""
  by_kind = {}
  for shape, kind, groups in run["collectives"]:
    by_kind.setdefault(kind, set()).add((groups, shape == "f32[]"))
  assert by_kind["reduce-scatter"] == {("{{0,1},{2,3}}", False)}
  assert by_kind["all-gather"] == {("{{0,1},{2,3}}", False)}
  assert by_kind["all-reduce"] == {("{{0,2},{1,3}}", False), ("{{0,1,2,3}}", True)}
