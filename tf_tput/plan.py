"""Parameters, FLOPs per token and training-state bytes per device of any config.

    python -m tf_tput.plan --gin_file=gin/models/decoder_136b.gin \
        --gin_file=gin/mesh/data2_model2.gin [--format=json]
    python -m tf_tput.plan --gin_file=gin/models/decoder_3b.gin \
        --gin_file=gin/mesh/data8.gin --gin_file=gin/pipeline/s16_m64.gin \
        --gin_param='TrainConfig.global_batch = 2048'

With a pipeline (gin/pipeline/), the mesh is one stage's and the plan has a row per
stage (tf_tput/pipeline.py): its layers, parameters and bytes per device.

No graph is built and no framework is imported: the numbers come from
tf_tput.models, the same arithmetic the result records use.
"""

import json

from absl import app
from absl import flags

from tf_tput import config, errors, models, pipeline

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable): a model, a mesh, ...")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_enum("format", "text", ["text", "json"], "Output format.")


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
  b = p["bytes_per_device"]
  return "\n".join([
      f"model                  {p['model']} ({p['arch']})",
      f"parameters             {p['num_params']:,}",
      f"mesh                   {p['mesh_shape']}"
      + (f" per stage x {p['pipeline_stages']} stages" if p["schedule"] else "")
      + f" ({p['num_devices']} devices), layout {p['layout']}",
      f"batch x lengths        {p['global_batch']} x (inputs {p['inputs_length']}, "
      f"targets {p['targets_length']}) = {p['tokens_per_step']:,} tokens/step",
      f"model FLOPs per token  {p['model_flops_per_token']:.4g} (3 x forward matmuls)",
      f"bytes per device       params {_gib(b['params'])} + Adafactor "
      f"{_gib(b['optimizer'])} = {_gib(b['total'])} (float32 state, no activations, "
      "unpipelined)",
      f"pipeline               {p['pipeline_stages']} stage(s) x {p['micro_batches']} "
      f"micro-batch(es), {p['schedule'] or 'none'}; bubble (S-1)/(M+S-1) = "
      f"{p['bubble_fraction']:.3f}",
      "per stage, per device  stage  layers    params           params      Adafactor"
      "    activations*         total",
      *(f"{'':23}{s['stage']:>5}  {s['layers'][0]:>3}-{s['layers'][1] - 1:<3} "
        f"{s['params']:>13,}  {_gib(s['param_bytes']):>13}  {_gib(s['optimizer_bytes']):>13}"
        f"  {_gib(s['activation_bytes']):>13}  {_gib(s['total_bytes']):>12}"
        for s in p["stages"]),
      "* activations: an estimate (tf_tput.pipeline.activation_bytes); the shared "
      "embedding counts on the first stage and, as the softmax's copy, on the last",
  ])


def run() -> int:
  p = plan(config.load_experiment(FLAGS.gin_file, FLAGS.gin_param))
  print(json.dumps(p) if FLAGS.format == "json" else format_text(p))
  return 0


def main(argv) -> int:
  return errors.run_entry_point(run, argv)


if __name__ == "__main__":
  app.run(main)
