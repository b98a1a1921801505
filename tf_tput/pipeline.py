"""Pipeline parallelism, framework-neutral: how a model splits into stages, which
devices and variables each stage gets, what a stage holds, and the GPipe bubble.

Stages as in Pathways Table 2: the embedding and the softmax count as one unit each
beside the L layers, and the L+2 units split as evenly as they divide, so the first
stage holds the embedding and one layer fewer, the last the softmax and one layer
fewer (62 layers, 4 stages: 15, 16, 16, 15). Where S does not divide L+2, the r
units left over go one each to the inner stages (layers only) from the first inner
stage on, then to the first stage: with the one-hot embedding (config.EMBEDDINGS) the
embedding is a vocabulary matmul as large as the softmax's, so the end stages are no
lighter than a layer-only stage and the inner ones take the extra layers first.

The devices split into S consecutive equal groups, stage s taking group s; the mesh
file's layout applies inside each group. Only decoder-only models pipeline (Table 2's).
Nothing here imports a framework: config.validate calls validate() in milliseconds.
`experiment` is always a config.Experiment, read and never imported (config imports
this module; imports go config -> pipeline -> models).
"""

import re
from typing import Optional, Sequence

from tf_tput import models
from tf_tput.errors import UsageError

SCHEDULES = ("gpipe",)  # all micro-batches forward, then all backward; one update
_BLOCK = re.compile(r"/block_(\d+)/")


def stage_units(num_layers: int, stages: int) -> list:
  """Units (layers, plus the embedding on the first and the softmax on the last)."""
  base, extra = divmod(num_layers + 2, stages)
  units = [base] * stages
  for s in (list(range(1, stages - 1)) + [0, stages - 1])[:extra]:
    units[s] += 1
  return units


def stage_layer_counts(num_layers: int, stages: int) -> list:
  units = stage_units(num_layers, stages)
  return [u - (s == 0) - (s == stages - 1) for s, u in enumerate(units)]


def stage_layer_ranges(num_layers: int, stages: int) -> list:
  """[(first layer, one past the last)] of each stage."""
  ranges, start = [], 0
  for count in stage_layer_counts(num_layers, stages):
    ranges.append((start, start + count))
    start += count
  return ranges


def bubble_fraction(stages: int, micro_batches: int) -> float:
  """GPipe's idle fraction: each stage waits S-1 of the M+S-1 slots of a step."""
  return (stages - 1) / (micro_batches + stages - 1)


def stage_devices(devices: Sequence, stages: int) -> list:
  """S consecutive equal groups of the devices, in their order."""
  per_stage = len(devices) // stages
  return [list(devices[s * per_stage:(s + 1) * per_stage]) for s in range(stages)]


def variable_stage(name: str, num_layers: int, stages: int) -> int:
  """The stage that holds a variable: a block's layers where it sits; the embedding
  (and the relative bias block_000 creates) on the first; the final norm on the last.
  The embedding, shared with the softmax, is also used by the last stage."""
  block = _BLOCK.search(name)
  if block is None:
    return 0 if name.endswith("/embedding") else stages - 1
  layer = int(block.group(1))
  for s, (start, stop) in enumerate(stage_layer_ranges(num_layers, stages)):
    if start <= layer < stop:
      return s
  raise ValueError(f"{name}: layer {layer} is in no stage of {num_layers} layers")


def validate(experiment, num_devices: Optional[int] = None) -> None:
  """Raises UsageError naming the first bad pipeline value and its fix."""
  p, m, t = experiment.pipeline, experiment.model, experiment.train
  for name in ("stages", "micro_batches"):
    value = getattr(p, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
      raise UsageError(f"PipelineConfig.{name} = {value!r}; it must be an integer >= 1")
  if p.schedule not in SCHEDULES:
    raise UsageError(f"PipelineConfig.schedule = {p.schedule!r}; choose one of "
                     f"{SCHEDULES}")
  S, M = p.stages, p.micro_batches
  if S == 1:
    if M != 1:
      raise UsageError(f"PipelineConfig.micro_batches = {M} needs PipelineConfig.stages "
                       ">= 2 (micro-batches without a pipeline are not implemented); "
                       "drop the binding or add stages")
    return
  where = f"PipelineConfig.stages = {S}"
  if m.arch != "decoder":
    raise UsageError(f"{where}: only decoder-only models pipeline (ModelConfig.arch = "
                     f"{m.arch!r}); use a decoder_*.gin model or stages = 1")
  if S > m.num_layers:
    raise UsageError(f"{where} is more stages than the model's {m.num_layers} layers; "
                     f"pass stages <= {m.num_layers}")
  if num_devices is not None and num_devices % S:
    raise UsageError(f"{where} does not divide the {num_devices} devices into equal "
                     "groups; choose a divisor of the device count or another "
                     "--num_cpu_devices")
  if M < S:
    raise UsageError(f"PipelineConfig.micro_batches = {M} < {S} stages leaves stages "
                     f"idle throughout; pass micro_batches >= {S} (the paper uses 4S = "
                     f"{4 * S})")
  if t.global_batch % M:
    raise UsageError(f"TrainConfig.global_batch = {t.global_batch} is not divisible by "
                     f"PipelineConfig.micro_batches = {M}; choose a multiple of {M}")
  micro_batch = t.global_batch // M
  batch_axis = experiment.layout.get("batch")
  shards = experiment.mesh_shape.get(batch_axis, 1)
  if micro_batch % shards:
    raise UsageError(f"micro-batch {t.global_batch} / {M} = {micro_batch} is not "
                     f"divisible by the stage's batch axis {batch_axis!r} of size "
                     f"{shards} (mesh_shape {experiment.mesh.mesh_shape!r}); choose a "
                     "global batch or micro_batches that gives a multiple of it")
  counts = stage_layer_counts(m.num_layers, S)
  if min(counts) < 1:
    raise UsageError(f"{where} splits {m.num_layers} layers + embedding + softmax as "
                     f"{counts} layers per stage; a stage without a layer is not "
                     "supported, pass fewer stages")


def _shards(size: int, name: str, mesh_shape: dict, layout: dict) -> float:
  axis = layout.get(name)
  return size / mesh_shape[axis] if axis in mesh_shape else size


def stage_plan(experiment) -> list:
  """Per stage: its layers, parameters, and bytes per device of its parameters,
  Adafactor slots and activations (an estimate; see activation_bytes)."""
  m, p = experiment.model, experiment.pipeline
  mesh_shape, layout = experiment.mesh_shape, experiment.layout
  S = p.stages
  rows = [{"stage": s, "layers": r, "params": 0, "param_bytes": 0, "optimizer_bytes": 0}
          for s, r in enumerate(stage_layer_ranges(m.num_layers, S))]
  for v in models.variables(m):
    holders = {variable_stage(v.name, m.num_layers, S)}
    if v.name.endswith("/embedding"):
      holders.add(S - 1)  # the softmax's copy of the shared embedding
    for s in holders:
      rows[s]["params"] += v.size
      per_device = models.sharded_size(v.dims, mesh_shape, layout)
      rows[s]["param_bytes"] += per_device * models.BYTES_PER_VARIABLE_ELEMENT
      if s == min(holders):  # one optimizer state, where the variable lives
        rows[s]["optimizer_bytes"] += models.BYTES_PER_VARIABLE_ELEMENT * sum(
            models.sharded_size(dims, mesh_shape, layout)
            for dims in models.adafactor_slot_dims(v))
  for row in rows:
    row["activation_bytes"] = activation_bytes(experiment, row["stage"])
    row["total_bytes"] = (row["param_bytes"] + row["optimizer_bytes"]
                          + row["activation_bytes"])
  return rows


def activation_bytes(experiment, stage: int) -> int:
  """Activation bytes on one device of a stage, an estimate for a rematerialised
  GPipe step: the stage's input of each of the M+S-1 loop iterations is kept for
  the backward pass, plus the tensors one micro-batch's pass through the stage's
  layers (and the embedding or softmax it holds) keeps while it is recomputed.
  Per token and layer those are the layer inputs and norms (2 d_model), q, k, v and
  the attention output (4 heads*d_kv), scores and weights (2 heads*length, float32)
  and the feed-forward hidden before and after the ReLU (2 d_ff), each divided by
  the mesh axis its dimension is laid out on. Unpipelined (S = 1) the same formula
  with one micro-batch. Framework buffers and temporaries are not counted."""
  m, p, t, d = experiment.model, experiment.pipeline, experiment.train, experiment.data
  mesh_shape, layout = experiment.mesh_shape, experiment.layout
  S, M = p.stages, p.micro_batches
  act = models.activation_bytes_per_element(m.activation_dtype)
  length = d.targets_length
  tokens = _shards(t.global_batch // M, "batch", mesh_shape, layout) * length
  inner = m.num_heads * m.d_kv
  per_layer = (act * (2 * m.d_model + 4 * _shards(inner, "heads", mesh_shape, layout)
                      + 2 * _shards(m.d_ff, "d_ff", mesh_shape, layout))
               + 4 * 2 * _shards(m.num_heads, "heads", mesh_shape, layout) * length)
  start, stop = stage_layer_ranges(m.num_layers, S)[stage]
  vocab = _shards(models.padded_vocab(m.vocab_size), "vocab", mesh_shape, layout)
  ends = (stage == 0) * act * vocab + (stage == S - 1) * 3 * 4 * vocab  # one-hot; logits
  boundary = (M + S - 1 if S > 1 else 0) * act * m.d_model
  return int(tokens * (boundary + (stop - start) * per_layer + ends))


def record_fields(experiment) -> dict:
  """The result record's pipeline fields (records/results.py)."""
  p = experiment.pipeline
  return {"pipeline_stages": p.stages, "micro_batches": p.micro_batches,
          "schedule": p.schedule if experiment.pipelined else None,
          "bubble_fraction": bubble_fraction(p.stages, p.micro_batches)}
