r"""Parameters, FLOPs per token and training-state bytes per device of any config.

    python -m tf_tput.plan --gin_file=decoder_136b --gin_file=data2_model2 [--format=json]
    python -m tf_tput.plan --gin_file=decoder_3b --gin_file=data8 --gin_file=s16_m64 \
        --gin_param='TrainConfig.global_batch = 2048'
    python -m tf_tput.plan --gin_file=t5_base --fit_memory_gib=64  # the largest batch

A --gin_file is a file name of gin/ (models/, mesh/, pipeline/) or a path
(config.resolve_gin_file). With a pipeline (gin/pipeline/), the mesh is one stage's
and the plan has a row per stage (tf_tput/pipeline.py): its layers, parameters and
bytes per device.

With --islands=K, Pathways §5.3's projection (tf_tput/dcn.py): the bytes each step's
gradient reduction sends between islands, their time over the DCN, the backward
compute they can hide behind, what stays exposed and the projected fraction of
single-island throughput, beside the paper's figures; bytes per device and per island
are those of the K x --devices_per_island devices' mesh (a config mesh of another
size has its batch axis scaled to it, and the plan says so):

    python -m tf_tput.plan --gin_file=decoder_64b --gin_file=data64_model16 \
        --gin_param='TrainConfig.global_batch = 1024' --islands=2 \
        --devices_per_island=512 [--calibrate_from=results/islands_local.jsonl]

No graph is built and no framework is imported: the numbers come from
tf_tput.models, the same arithmetic the result records use.
"""

import dataclasses
import json
import math
import re
from typing import Optional

from absl import flags

from tf_tput import GIN_DIR, config, dcn, entry, errors, models, pipeline
from tf_tput.errors import UsageError
from tf_tput.measure import peak as peak_lib
from tf_tput.records import results
from tf_tput.report import published

FLAGS = flags.FLAGS
_MESH_BINDING = re.compile(r"^MeshConfig\.mesh_shape\s*=\s*['\"]([^'\"]*)['\"]", re.M)
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable): a model, a mesh, ... "
                          "(a file name such as t5_small, or a path).")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_enum("format", "text", ["text", "json"], "Output format.")
flags.DEFINE_float("fit_memory_gib", None, "Plan the largest global batch, doubling "
                   "from the config's, whose bytes per device (the largest stage's "
                   "parameters, Adafactor slots and estimated activations) fit in this "
                   "many GiB of one device's memory.")
flags.DEFINE_integer("islands", 1, "Project data parallelism across this many islands.")
flags.DEFINE_integer("devices_per_island", None, "With --islands: accelerators per "
                     "island (unset: the mesh's devices / islands).")
flags.DEFINE_integer("hosts_per_island", None, "With --islands: hosts per island, each "
                     "with its own DCN link (unset: devices_per_island / 4, TPU v4's "
                     "4 chips per host).")
flags.DEFINE_float("dcn_gbps_per_host", 100.0, "With --islands: each host's DCN "
                   "bandwidth in Gbit/s (an assumption; the paper does not state it).")
flags.DEFINE_float("link_efficiency", 1.0, "With --islands: achieved / nominal DCN "
                   "bandwidth (overridden by --calibrate_from).")
flags.DEFINE_string("calibrate_from", None, "With --islands: results of the local "
                    "sweep (suite islands_local) to take the link efficiency from.")
flags.DEFINE_float("overlap", 0.0, "With --islands: fraction of the backward pass the "
                   "transfer hides behind (0: none, the conservative default; 1: all).")
flags.DEFINE_string("accelerator", "tpu_v4", "With --islands: whose bfloat16 peak the "
                    f"compute time uses ({', '.join(sorted({k for k, _ in peak_lib.PEAK_FLOPS}))}).")
flags.DEFINE_float("mfu", 0.5, "With --islands: the step's MFU against that peak.")


@dataclasses.dataclass(frozen=True)
class PlanRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  gin_file: tuple
  gin_param: tuple
  format: str
  fit_memory_gib: Optional[float]
  islands: int
  devices_per_island: Optional[int]
  hosts_per_island: Optional[int]
  dcn_gbps_per_host: float
  link_efficiency: float
  calibrate_from: Optional[str]
  overlap: float
  accelerator: str
  mfu: float


def plan(experiment: config.Experiment) -> dict:
  m, d = experiment.model, experiment.data
  inputs_length = d.inputs_length if m.arch == "encoder_decoder" else 0
  return {
      "model": m.name, "arch": m.arch, "num_params": models.num_params(m),
      "mesh_shape": experiment.mesh.mesh_shape, "layout": experiment.mesh.layout,
      "num_devices": experiment.num_devices, "global_batch": experiment.train.global_batch,
      "inputs_length": inputs_length or None, "targets_length": d.targets_length,
      "tokens_per_step": experiment.train.global_batch * models.tokens_per_example(
          m, inputs_length, d.targets_length),
      "model_flops_per_token": models.model_flops_per_token(m, inputs_length,
                                                            d.targets_length),
      "bytes_per_device": models.bytes_per_device(m, experiment.mesh_shape,
                                                  experiment.layout),
      **pipeline.record_fields(experiment),
      "stages": pipeline.stage_plan(experiment),
  }


def _gib(n: int) -> str:
  return f"{n / 2**30:,.2f} GiB"


def format_text(p: dict) -> str:
  return "\n".join([
      f"model                  {p['model']} ({p['arch']})",
      f"parameters             {p['num_params']:,}",
      f"mesh                   {p['mesh_shape']}"
      + (f" per stage x {p['pipeline_stages']} stages" if p["schedule"] else "")
      + f" ({p['num_devices']} devices), layout {p['layout']}",
      *_assumed_mesh_lines(p),
      f"batch x lengths        {p['global_batch']} x (inputs {p['inputs_length']}, "
      f"targets {p['targets_length']}) = {p['tokens_per_step']:,} tokens/step",
      f"model FLOPs per token  {p['model_flops_per_token']:.4g} (3 x forward matmuls)",
      *(_stage_lines(p) if p["schedule"] else _device_lines(p["stages"][0])),
  ])


def _assumed_mesh_lines(p: dict) -> list:
  a = p.get("assumed_mesh")
  if not a:
    return []
  per_stage = " per stage" if p["schedule"] else ""
  group = config.parse_mesh_shape(p["mesh_shape"])
  files = mesh_files(config.mesh_size(group), besides=group)
  return [f"{'':23}assumed: {a['islands']} islands x {a['devices_per_island']} devices "
          f"on the config's mesh {a['config_mesh_shape']}{per_stage}, its batch axis "
          f"scaled to fill them; a mesh file of {config.mesh_size(group)} devices"
          f"{per_stage} (" + (", ".join(files) or "gin/mesh/") + ") splits them otherwise"]


def mesh_files(devices: int, besides: dict) -> list:
  """The names of gin/mesh's files whose mesh has this many devices, other than
  `besides`."""
  found = []
  for path in sorted((GIN_DIR / "mesh").glob("*.gin")):
    bound = _MESH_BINDING.search(path.read_text())
    shape = bound and config.parse_mesh_shape(bound.group(1))
    if shape and shape != besides and config.mesh_size(shape) == devices:
      found.append(path.stem)
  return found


def _device_lines(s: dict) -> list:
  """Without a pipeline: the one group of devices' bytes, each device's."""
  return [f"bytes per device       params {_gib(s['param_bytes'])} + Adafactor "
          f"{_gib(s['optimizer_bytes'])} + activations* {_gib(s['activation_bytes'])} "
          f"= {_gib(s['total_bytes'])} (float32 state)",
          "* activations: an estimate (tf_tput.pipeline.activation_bytes)"]


def _stage_lines(p: dict) -> list:
  b = p["bytes_per_device"]
  return [
      f"bytes per device       params {_gib(b['params'])} + Adafactor "
      f"{_gib(b['optimizer'])} = {_gib(b['total'])} (float32 state, no activations, "
      "unpipelined)",
      f"pipeline               {p['pipeline_stages']} stages x {p['micro_batches']} "
      f"micro-batches, {p['schedule']}; bubble (S-1)/(M+S-1) = "
      f"{p['bubble_fraction']:.3f}",
      "per stage, per device  stage  layers    params           params      Adafactor"
      "    activations*         total",
      *(f"{'':23}{s['stage']:>5}  {s['layers'][0]:>3}-{s['layers'][1] - 1:<3} "
        f"{s['params']:>13,}  {_gib(s['param_bytes']):>13}  {_gib(s['optimizer_bytes']):>13}"
        f"  {_gib(s['activation_bytes']):>13}  {_gib(s['total_bytes']):>12}"
        for s in p["stages"]),
      "* activations: an estimate (tf_tput.pipeline.activation_bytes); the shared "
      "embedding counts on the first stage and, as the softmax's copy, on the last",
  ]


def _assumptions(request: PlanRequest, experiment) -> tuple:
  """(devices per island, dcn.Assumptions, where the efficiency came from)."""
  K = request.islands
  per_island = request.devices_per_island or experiment.num_devices // K
  if per_island < 1 or (not request.devices_per_island and experiment.num_devices % K):
    raise UsageError(f"--islands={K} does not divide the mesh's {experiment.num_devices} "
                     "devices; pass --devices_per_island")
  peak = peak_lib.PEAK_FLOPS.get((request.accelerator, "bfloat16"))
  if peak is None:
    raise UsageError(f"--accelerator={request.accelerator} has no bfloat16 peak; choose "
                     f"one of {', '.join(sorted({k for k, _ in peak_lib.PEAK_FLOPS}))}")
  efficiency, source = request.link_efficiency, "--link_efficiency"
  if request.calibrate_from:
    calibrated = dcn.calibrate_efficiency(
        results.read(request.calibrate_from, results.SCHEMA)[0])
    if calibrated is None:
      raise UsageError(f"--calibrate_from={request.calibrate_from} has no island runs on "
                       "a shaped and an unshaped link to compare; run suite islands_local")
    efficiency = calibrated[0]
    source = f"calibrated from {calibrated[1]} run(s) in {request.calibrate_from}"
  for name, value, low, high in (("link_efficiency", efficiency, 0, 1),
                                 ("overlap", request.overlap, 0, 1),
                                 ("mfu", request.mfu, 0, 1)):
    if not low <= value <= high or (name != "overlap" and value == 0):
      raise UsageError(f"--{name}={value}; it must be in (0, 1]" if name != "overlap"
                       else f"--overlap={value}; it must be in [0, 1]")
  hosts = request.hosts_per_island or max(1, per_island // 4)
  return per_island, dcn.Assumptions(hosts, request.dcn_gbps_per_host, efficiency,
                                     request.overlap, peak, request.mfu), source


def island_mesh(experiment, num_islands: int, per_island: int):
  """The mesh_shape (a stage's, with a pipeline) that spreads the config's mesh over
  the islands' devices: the batch axis, first, scaled; the other axes kept, since how
  far the model splits is the mesh file's choice. None where the mesh has them."""
  devices = num_islands * per_island
  if experiment.num_devices == devices:
    return None
  axis = experiment.layout.get("batch", "batch")
  others = {a: n for a, n in experiment.mesh_shape.items() if a != axis}
  split = config.mesh_size(others) * experiment.pipeline.stages
  if devices % split:
    raise UsageError(f"--devices_per_island={per_island}: {num_islands} x {per_island} "
                     f"devices are not a multiple of the {split} that mesh_shape "
                     f"{experiment.mesh.mesh_shape!r}'s other axes"
                     + (" and stages" if experiment.pipelined else "")
                     + f" take; pass a mesh file of {devices} devices (gin/mesh/)")
  return ";".join(f"{a}:{n}" for a, n in {axis: devices // split, **others}.items())


def _check_islands(experiment, num_islands: int) -> None:
  """How the mesh splits across the islands, checked as tf_tput.train and a suite's
  validation check it (preflight.check_shape), for whichever system would run it."""
  # Imported here: preflight brings train's request and numpy, which a plan without
  # islands never needs.
  from tf_tput import preflight
  preflight.check_shape(None, experiment, num_islands=num_islands)


def island_experiment(experiment, gin_files, gin_params: list, num_islands: int,
                      per_island: int):
  """(the experiment on the devices the projection counts, its gin params, what was
  assumed or None): per-device bytes are those of that mesh, not the config's."""
  if experiment.pipelined:  # S/K stages an island, whatever the mesh: say that first
    _check_islands(experiment, num_islands)
  shape = island_mesh(experiment, num_islands, per_island)
  if shape is None:
    return experiment, gin_params, None
  scaled = list(gin_params) + [f"MeshConfig.mesh_shape = '{shape}'"]
  try:
    projected = config.load_experiment(gin_files, scaled)
  except UsageError as e:
    raise UsageError(f"--devices_per_island={per_island}: the config's mesh "
                     f"{experiment.mesh.mesh_shape!r} scaled to {shape!r}: {e}; or pass a "
                     f"mesh file of {num_islands * per_island} devices (gin/mesh/)") from None
  return projected, scaled, {"config_mesh_shape": experiment.mesh.mesh_shape,
                             "islands": num_islands, "devices_per_island": per_island}


def island_bytes(p: dict, num_islands: int) -> list:
  """Per island, what its devices hold (parameters, Adafactor slots, activations*), in
  all and on its fullest device: data parallel, a block of the one group's devices;
  with a pipeline, S/K whole stages."""
  S, rows = p["pipeline_stages"], p["stages"]
  devices = p["num_devices"] // num_islands
  if S == 1:
    held = [(rows, devices)] * num_islands
  else:
    k = S // num_islands
    held = [(rows[i * k:(i + 1) * k], p["num_devices"] // S) for i in range(num_islands)]
  return [{"island": i, "devices": devices, "stages": [r["stage"] for r in held_rows],
           "bytes": per_stage * sum(r["total_bytes"] for r in held_rows),
           "device_bytes": max(r["total_bytes"] for r in held_rows)}
          for i, (held_rows, per_stage) in enumerate(held)]


def _island_bytes_lines(d: dict) -> list:
  rows = d["per_island"]
  if all(r["stages"] == [0] for r in rows):  # data parallel: every island alike
    r = rows[0]
    return [f"per island             {r['devices']} devices: {_gib(r['bytes'])} of "
            f"parameters, Adafactor and activations* in all, {_gib(r['device_bytes'])} "
            "on each device (as above)"]
  return [f"{'per island' if r['island'] == 0 else '':23}island {r['island']}: "
          f"{r['devices']} devices, stage{_span(r['stages'])}: {_gib(r['bytes'])} in all, "
          f"at most {_gib(r['device_bytes'])} per device" for r in rows]


def _span(stages: list) -> str:
  return f" {stages[0]}" if len(stages) == 1 else f"s {stages[0]}-{stages[-1]}"


def format_islands(d: dict, model: str, source: str) -> str:
  a = d["assumptions"]
  pub = published.MULTI_ISLAND.get(model)
  lines = [
      f"islands                {d['islands']} x {d['devices_per_island']} devices, "
      f"{a['hosts_per_island']} hosts each at {a['gbps_per_host']:g} Gbit/s, link "
      f"efficiency {a['link_efficiency']:.2f} ({source})",
      *_island_bytes_lines(d),
      f"bytes per reduction    {d['bytes_per_reduction'] / 1e9:,.1f} GB over all links "
      f"(2(K-1) float32 gradients of {d['gradient_bytes'] / 1e9:,.1f} GB), "
      f"{d['bytes_sent_per_island'] / 1e9:,.1f} GB sent per island",
      f"DCN transfer           {d['transfer_s']:.3f} s per step at "
      f"{d['island_dcn_bytes_per_s'] / 1e9:,.1f} GB/s per island",
      f"compute                {d['compute_s']:.3f} s per step ({d['tokens_per_step']:,} "
      f"tokens at {100 * a['mfu']:.0f}% MFU of {a['peak_flops_per_device'] / 1e12:g} "
      f"TFLOP/s), backward {d['backward_s']:.3f} s, overlap {a['overlap']:g}",
      f"exposed                {d['exposed_s']:.3f} s -> projected "
      f"{d['fraction_of_single_island']:.3f} of single-island throughput",
  ]
  if pub:
    lines.append(
        f"published (§5.3)       {pub.islands} x {pub.cores_per_island} cores: "
        f"{pub.bytes_per_reduction / 1e9:,.0f} GB per reduction, {pub.fraction:g} of "
        "single-island throughput. Here each parameter's float32 gradient crosses once "
        "each way (8 bytes/parameter); the paper's figure is "
        f"{pub.bytes_per_reduction / (d['gradient_bytes'] / 4):.2f} bytes per parameter "
        "of this file's model, whose dimensions the paper does not state")
  return "\n".join(lines)


def format_pipeline_islands(d: dict, model: str, source: str) -> str:
  a = d["assumptions"]
  pub = published.MULTI_ISLAND_PIPELINE.get(model)
  lines = [
      f"islands                {d['islands']} x {d['devices_per_island']} devices, "
      f"{d['stages'] // d['islands']} of {d['stages']} stages each, "
      f"{a['hosts_per_island']} hosts per island at {a['gbps_per_host']:g} Gbit/s, link "
      f"efficiency {a['link_efficiency']:.2f} ({source})",
      *_island_bytes_lines(d),
      f"bytes per step         {d['bytes_per_step'] / 1e9:,.2f} GB over all links: "
      f"{d['boundaries_on_links']} stage boundaries x 2 x {d['micro_batches']} "
      f"micro-batches of {d['micro_batch_bytes'] / 1e6:,.1f} MB, and the shared "
      "embedding's gradient once each way",
      f"DCN transfer           {d['micro_batch_transfer_s'] * 1e3:.2f} ms per micro-batch "
      f"at {d['stage_dcn_bytes_per_s'] / 1e9:,.1f} GB/s per boundary stage, embedding "
      f"{d['embedding_s'] * 1e3:.1f} ms",
      f"compute                {d['compute_s']:.3f} s per step ({d['tokens_per_step']:,} "
      f"tokens at {100 * a['mfu']:.0f}% MFU of {a['peak_flops_per_device'] / 1e12:g} "
      f"TFLOP/s), {d['slot_s'] * 1e3:.1f} ms per micro-batch slot",
      f"exposed                {d['exposed_s'] * 1e3:.1f} ms -> projected "
      f"{d['fraction_of_single_island']:.3f} of single-island throughput",
  ]
  if pub:
    # Table 2's row for the same pipeline on as many cores in one island.
    [one_island] = [row for row in published.TABLE2_DECODER_3B
                    if (row.stages, row.micro_batches, row.cores)
                    == (pub.stages, pub.micro_batches, pub.islands * pub.cores_per_island)]
    lines.append(
        f"published (Table 2)    S={pub.stages}, M={pub.micro_batches} on {pub.islands} "
        f"islands x {pub.cores_per_island} cores: the same "
        f"{one_island.tokens_per_sec / 1e3:.1f}k tokens/s as one island ({pub.fraction:g})")
  return "\n".join(lines)


def largest_fitting(gin_files, gin_params, memory_bytes: float):
  """(the experiment of the largest global batch, doubling from the config's, whose
  largest stage's total bytes per device fit in memory_bytes; the next batch's bytes).
  UsageError where even the config's batch does not fit."""
  def load(batch):
    bound = [] if batch is None else [f"TrainConfig.global_batch = {batch}"]
    experiment = config.load_experiment(gin_files, list(gin_params) + bound)
    return experiment, max(s["total_bytes"] for s in pipeline.stage_plan(experiment))

  fitting, need = load(None)
  if need > memory_bytes:
    raise UsageError(f"--fit_memory_gib={memory_bytes / 2**30:g}: the config's global "
                     f"batch {fitting.train.global_batch} already needs {_gib(need)} "
                     "per device; give more memory or a smaller batch")
  while True:
    larger, need = load(2 * fitting.train.global_batch)
    if need > memory_bytes:
      return fitting, need
    fitting = larger


def _fit(request: PlanRequest, experiment, gin_params: list):
  """(the experiment at the largest global batch that fits, its text line, its JSON
  field), or the experiment as it is without --fit_memory_gib."""
  memory_gib = request.fit_memory_gib
  if memory_gib is None:
    return experiment, None, None
  if not 0 < memory_gib < math.inf:  # NaN too; inf would never stop doubling
    raise UsageError(f"--fit_memory_gib={memory_gib}; it must be > 0 (GiB) and finite")
  experiment, next_bytes = largest_fitting(request.gin_file, gin_params,
                                           memory_gib * 2**30)
  line = (f"fits {memory_gib:g} GiB   global batch "
          f"{experiment.train.global_batch} (twice that needs {_gib(next_bytes)} "
          "per device)")
  return experiment, line, {"memory_gib": memory_gib, "next_batch_bytes": next_bytes}


def _project(experiment, p: dict, assumptions, num_islands: int) -> dict:
  if experiment.pipelined:  # island_experiment checked its stages
    d = dcn.project_pipeline(experiment, num_islands, p["num_devices"] // num_islands,
                             assumptions)
  else:
    _check_islands(experiment, num_islands)
    d = dcn.project(experiment, num_islands, p["num_devices"] // num_islands,
                    assumptions)
  return {**d, "per_island": island_bytes(p, num_islands)}


def run(request: PlanRequest) -> int:
  if request.islands < 1:
    raise UsageError(f"--islands={request.islands}; it must be >= 1")
  gin_params = list(request.gin_param)
  experiment = config.load_experiment(request.gin_file, gin_params)
  assumed = source = None
  if request.islands > 1:
    per_island, assumptions, source = _assumptions(request, experiment)
    experiment, gin_params, assumed = island_experiment(
        experiment, request.gin_file, gin_params, request.islands, per_island)
  experiment, fit_line, fit = _fit(request, experiment, gin_params)
  p = plan(experiment)
  if fit:
    p["fit"] = fit
  if assumed:
    p["assumed_mesh"] = assumed
  if request.islands > 1:
    p["islands"] = _project(experiment, p, assumptions, request.islands)
  if request.format == "json":
    print(json.dumps(p))
  else:
    print(format_text(p))
    if fit_line:
      print(fit_line)
    if "islands" in p:
      print(format_pipeline_islands(p["islands"], p["model"], source)
            if experiment.pipelined else format_islands(p["islands"], p["model"], source))
  return 0


def main(argv) -> int:
  request = PlanRequest(
      gin_file=tuple(FLAGS.gin_file), gin_param=tuple(FLAGS.gin_param),
      format=FLAGS.format, fit_memory_gib=FLAGS.fit_memory_gib, islands=FLAGS.islands,
      devices_per_island=FLAGS.devices_per_island,
      hosts_per_island=FLAGS.hosts_per_island, dcn_gbps_per_host=FLAGS.dcn_gbps_per_host,
      link_efficiency=FLAGS.link_efficiency, calibrate_from=FLAGS.calibrate_from,
      overlap=FLAGS.overlap, accelerator=FLAGS.accelerator, mfu=FLAGS.mfu)
  return errors.run_entry_point(lambda: run(request), argv)


if __name__ == "__main__":
  entry.start(main)
