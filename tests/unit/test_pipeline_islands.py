"""A pipeline across islands: which configs are accepted, and the bytes each system's
schedule sends over the links, by hand (tests/e2e/test_islands_cli.py counts them)."""

import pytest

from tf_tput import config, island_split, models, reduction
from tf_tput.errors import UsageError
from tf_tput.systems.jax import pipeline as jax_pipeline

PIPELINE = ["gin/models/decoder_deep.gin", "gin/mesh/data2.gin", "gin/pipeline/s4_m16.gin"]
BINDINGS = ["TrainConfig.global_batch = 32", "DataConfig.targets_length = 64"]


def _experiment(*extra):
  return config.load_experiment(PIPELINE, BINDINGS + list(extra))


def test_stages_split_across_islands_in_equal_runs():
  e = _experiment()
  island_split.check_mesh(e, 2, ("data", "pipeline"))
  island_split.check_mesh(e, 4, ("data", "pipeline"))
  assert [island_split.island_of_stage(s, 4, 2) for s in range(4)] == [0, 0, 1, 1]
  with pytest.raises(UsageError, match="PipelineConfig.stages = 4 across 3 islands.*"
                     "multiple of 3"):
    island_split.check_mesh(e, 3, ("data", "pipeline"))
  with pytest.raises(UsageError, match="data parallel across islands; drop the pipeline"):
    island_split.check_mesh(e, 2, ("data",))


def test_a_ring_crosses_the_islands_on_k_edges():
  assert reduction.ring_link_bytes(1000, 4, 1) == 0
  assert reduction.ring_link_bytes(1000, 4, 2) == 2 * 2 * 3 * 1000 // 4  # 2 edges x 3/2
  assert reduction.analytic_link_bytes(1000, 3) == 4000  # 2(K-1) copies: one member each


def test_a_ring_placed_anyhow_crosses_on_the_edges_between_islands():
  """Ray's placement decides where each actor is: interleaved, every edge crosses."""
  assert reduction.ring_bytes_between(1000, ["a", "a", "b", "b"]) == 2 * 2 * 3 * 1000 // 4
  assert reduction.ring_bytes_between(1000, ["a", "b", "a", "b"]) == 4 * 2 * 3 * 1000 // 4
  assert reduction.ring_bytes_between(1000, ["a", "a"]) == 0  # packed on one node
  assert reduction.ring_bytes_between(1000, ["a"]) == 0


@pytest.mark.parametrize("num_islands", [2, 4])
def test_jax_pipeline_link_bytes_by_hand(num_islands):
  e = _experiment()
  boundary = 32 // 16 * 64 * 128 * 4          # one micro-batch's activations, float32
  loop = 16 + 4 - 1                           # M + S - 1 iterations send, forward and back
  shared = (512 * 128 + 4 * 32 + 128) * 4     # embedding, relative bias, final norm
  ring = 2 * num_islands * 3 * (2 * shared) // 4  # both in-stage devices, S = 4 members
  assert jax_pipeline.link_bytes(e, num_islands) == (
      (num_islands - 1) * 2 * loop * boundary + ring)
  assert jax_pipeline.link_bytes(e, 1) is None
  half = jax_pipeline.link_bytes(_experiment("ModelConfig.activation_dtype = 'bfloat16'"), 2)
  assert half == jax_pipeline.link_bytes(e, 2) // 2
  assert models.activation_bytes_per_element("bfloat16") == 2


def test_a_mesh_that_does_not_split_names_the_mesh_to_pass():
  """launch --islands=2 --num_processes=2 with --num_cpu_devices=2 and the default
  one-device mesh: 4 devices run, so a 4-device batch-only mesh is the one to pass."""
  from tf_tput import GIN_DIR
  assert (GIN_DIR / "mesh" / "data4.gin").is_file()
  single = config.load_experiment(["gin/models/t5_tiny.gin"])
  with pytest.raises(UsageError) as raised:
    island_split.check_mesh(single, 2, ("data",), num_devices=4)
  assert str(raised.value) == (
      "batch axis 'batch' does not split into 2 islands; the mesh is 'batch:1' (1 device) "
      "but 4 devices run: pass a mesh with 4 devices such as --gin_file=data4")
  # The flag it names gives a mesh that splits.
  island_split.check_mesh(config.load_experiment(["gin/models/t5_tiny.gin", "gin/mesh/data4.gin"]),
                     2, ("data",), num_devices=4)
  # No mesh file of that size: the binding to pass.
  with pytest.raises(UsageError, match=r"but 6 devices run: pass a mesh with 6 devices "
                     r"such as --gin_param=\"MeshConfig.mesh_shape = 'batch:6'\"$"):
    island_split.check_mesh(single, 2, ("data",), num_devices=6)
  # A device count that does not split, and an unknown one (accelerators).
  with pytest.raises(UsageError, match="3 devices run, which do not split into 2 islands: "
                     "run a multiple of 2 devices .* --gin_file=data2"):
    island_split.check_mesh(single, 2, ("data",), num_devices=3)
  with pytest.raises(UsageError, match=r"the mesh is 'batch:1' \(1 device\): pass a mesh "
                     r"over all the run's devices .* --gin_file=data2"):
    island_split.check_mesh(single, 2, ("data",))
  # mtf splits the model inside islands: its mesh has all the devices, the batch 1.
  model_only = config.load_experiment(["gin/models/t5_tiny.gin"],
                                      ["MeshConfig.mesh_shape = 'batch:1;model:4'"])
  with pytest.raises(UsageError, match=r"the mesh is 'batch:1;model:4' \(4 devices\) and 4 "
                     "devices run: .* --gin_file=data4"):
    island_split.check_mesh(model_only, 2, ("data", "model"), num_devices=4)
