"""A pipeline across islands: which configs are accepted, and the bytes each system's
schedule sends over the links, by hand (tests/e2e/test_islands_cli.py counts them)."""

import pytest

from tf_tput import config, models
from tf_tput.errors import UsageError
from tf_tput.runtime import islands
from tf_tput.systems import jax_pipeline

PIPELINE = ["gin/models/decoder_deep.gin", "gin/mesh/data2.gin", "gin/pipeline/s4_m16.gin"]
BINDINGS = ["TrainConfig.global_batch = 32", "DataConfig.targets_length = 64"]


def _experiment(*extra):
  return config.load_experiment(PIPELINE, BINDINGS + list(extra))


def test_stages_split_across_islands_in_equal_runs():
  e = _experiment()
  islands.check_mesh(e, 2, ("data", "pipeline"))
  islands.check_mesh(e, 4, ("data", "pipeline"))
  assert [islands.island_of_stage(s, 4, 2) for s in range(4)] == [0, 0, 1, 1]
  with pytest.raises(UsageError, match="PipelineConfig.stages = 4 across 3 islands.*"
                     "multiple of 3"):
    islands.check_mesh(e, 3, ("data", "pipeline"))
  with pytest.raises(UsageError, match="data parallel across islands; drop the pipeline"):
    islands.check_mesh(e, 2, ("data",))


def test_a_ring_crosses_the_islands_on_k_edges():
  assert islands.ring_link_bytes(1000, 4, 1) == 0
  assert islands.ring_link_bytes(1000, 4, 2) == 2 * 2 * 3 * 1000 // 4  # 2 edges x 3/2
  assert islands.analytic_link_bytes(1000, 3) == 4000  # 2(K-1) copies: one member each


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
