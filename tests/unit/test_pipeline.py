"""tf_tput/pipeline.py: the Table 2 stage split, validation, the per-stage plan."""

import itertools

import pytest

from tf_tput import config, models, pipeline
from tf_tput.errors import UsageError


def _experiment(*params, model="decoder_tiny"):
  return config.load_experiment([f"gin/models/{model}.gin"], list(params))


@pytest.mark.parametrize("layers, stages, counts", [
    (62, 4, [15, 16, 16, 15]),     # the paper's 3B decoder: 64 units in 4
    (62, 8, [7, 8, 8, 8, 8, 8, 8, 7]),
    (62, 16, [3] + [4] * 14 + [3]),
    (14, 4, [3, 4, 4, 3]),          # decoder_deep, table2_local
    (4, 2, [2, 2]),
    (5, 3, [1, 3, 1]),              # 7 units: the extra one to the inner stage
    (6, 4, [1, 2, 2, 1]),
    (9, 4, [2, 3, 3, 1]),           # 11 units: inner stages first, then the first
])
def test_layers_split_with_embedding_and_softmax_as_one_unit_each(layers, stages, counts):
  assert pipeline.stage_layer_counts(layers, stages) == counts
  assert sum(counts) == layers
  ranges = pipeline.stage_layer_ranges(layers, stages)
  assert ranges[0][0] == 0 and ranges[-1][1] == layers
  assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_bubble_and_device_groups():
  assert pipeline.bubble_fraction(4, 16) == pytest.approx(3 / 19)
  assert pipeline.bubble_fraction(1, 1) == 0
  assert pipeline.stage_devices(list("abcdefgh"), 4) == [list("ab"), list("cd"),
                                                         list("ef"), list("gh")]


def test_every_variable_is_held_by_the_stage_of_its_layer():
  m = _experiment("ModelConfig.num_layers = 4").model
  stage = {v.name: pipeline.variable_stage(v.name, m.num_layers, 2)
           for v in models.variables(m)}
  assert stage["decoder/embedding"] == 0
  assert stage["decoder/block_000/layer_000/SelfAttention/relative_attention_bias"] == 0
  assert stage["decoder/block_001/layer_001/DenseReluDense/wo/kernel"] == 0
  assert stage["decoder/block_002/layer_000/SelfAttention/q"] == 1
  assert stage["decoder/rms_norm/scale"] == 1


@pytest.mark.parametrize("params, num_devices, message", [
    (["PipelineConfig.stages = 3", "PipelineConfig.micro_batches = 4",
      "ModelConfig.num_layers = 4"], 4,
     "does not divide the 4 devices"),
    (["PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 1"], 2,
     "micro_batches = 1 < 2 stages"),
    (["PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 3"], 2,
     "global_batch = 8 is not divisible by PipelineConfig.micro_batches = 3"),
    (["PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 8",
      "MeshConfig.mesh_shape = 'batch:2'"], 4, "micro-batch 8 / 8 = 1 is not divisible"),
    (["PipelineConfig.stages = 3", "PipelineConfig.micro_batches = 4"], 3,
     "more stages than the model's 2 layers"),
    (["PipelineConfig.micro_batches = 4"], 1, "needs PipelineConfig.stages >= 2"),
    (["PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 2",
      "PipelineConfig.schedule = '1f1b'"], 2, "choose one of ('gpipe',)"),
    (["PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 2"], 4,
     "has 2 devices but 4 are available"),
])
def test_bad_pipelines_fail_before_any_framework(params, num_devices, message):
  with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
    config.validate(_experiment(*params), num_devices=num_devices)


def test_only_decoders_pipeline():
  with pytest.raises(UsageError, match="only decoder-only models pipeline"):
    _experiment("PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 2",
                model="t5_tiny")


def test_a_pipelined_mesh_is_one_stage_and_the_unpipelined_twin_has_its_devices():
  e = _experiment("PipelineConfig.stages = 2", "PipelineConfig.micro_batches = 4",
                  "MeshConfig.mesh_shape = 'batch:2'")
  assert e.num_devices == 4 and e.pipelined
  twin = config.unpipelined(e)
  assert twin.mesh.mesh_shape == "batch:4" and twin.num_devices == 4
  assert not twin.pipelined and twin.model == e.model and twin.train == e.train
  assert pipeline.record_fields(e) == {"pipeline_stages": 2, "micro_batches": 4,
                                       "schedule": "gpipe",
                                       "bubble_fraction": pytest.approx(0.2)}
  assert pipeline.record_fields(twin)["schedule"] is None


def test_stage_plan_adds_up_to_the_unpipelined_model():
  whole = _experiment("ModelConfig.num_layers = 4")
  piped = _experiment("ModelConfig.num_layers = 4", "PipelineConfig.stages = 2",
                      "PipelineConfig.micro_batches = 4")
  flat = pipeline.stage_plan(whole)
  assert len(flat) == 1 and flat[0]["params"] == models.num_params(whole.model)
  assert flat[0]["param_bytes"] + flat[0]["optimizer_bytes"] == models.bytes_per_device(
      whole.model, whole.mesh_shape, whole.layout)["total"]
  stages = pipeline.stage_plan(piped)
  embedding = 512 * 64  # decoder_tiny's padded vocabulary x d_model, on both ends
  assert sum(s["params"] for s in stages) == models.num_params(whole.model) + embedding
  assert sum(s["optimizer_bytes"] for s in stages) == flat[0]["optimizer_bytes"]
  assert [s["layers"] for s in stages] == [(0, 2), (2, 4)]
  # Two micro-batches of a stage's layers hold fewer activations than the whole
  # batch through every layer, though each stage also keeps its M+S-1 inputs.
  assert all(0 < s["activation_bytes"] < flat[0]["activation_bytes"] for s in stages)
