"""Parameters, FLOPs per token and training-state bytes per device of any config.

    python -m tf_tput.plan --gin_file=gin/models/decoder_136b.gin \
        --gin_file=gin/mesh/data2_model2.gin [--format=json]

No graph is built and no framework is imported: the numbers come from
tf_tput.models, the same arithmetic the result records use.
"""

import json

from absl import app
from absl import flags

from tf_tput import config, errors, models

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
  }


def _gib(n: int) -> str:
  return f"{n / 2**30:,.2f} GiB"


def format_text(p: dict) -> str:
  b = p["bytes_per_device"]
  return "\n".join([
      f"model                  {p['model']} ({p['arch']})",
      f"parameters             {p['num_params']:,}",
      f"mesh                   {p['mesh_shape']} ({p['num_devices']} devices), "
      f"layout {p['layout']}",
      f"batch x lengths        {p['global_batch']} x (inputs {p['inputs_length']}, "
      f"targets {p['targets_length']}) = {p['tokens_per_step']:,} tokens/step",
      f"model FLOPs per token  {p['model_flops_per_token']:.4g} (3 x forward matmuls)",
      f"bytes per device       params {_gib(b['params'])} + Adafactor "
      f"{_gib(b['optimizer'])} = {_gib(b['total'])} (float32 state, no activations)",
  ])


def run() -> int:
  p = plan(config.load_experiment(FLAGS.gin_file, FLAGS.gin_param))
  print(json.dumps(p) if FLAGS.format == "json" else format_text(p))
  return 0


def main(argv) -> int:
  return errors.run_entry_point(run, argv)


if __name__ == "__main__":
  app.run(main)
