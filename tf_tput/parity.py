"""Same weights, same batches, two systems: a per-step loss table.

    python -m tf_tput.parity --gin_file=gin/models/t5_tiny.gin \
        [--gin_file=gin/mesh/data2_model2.gin --num_cpu_devices=4] [--steps=10]

Builds the TF baseline (mtf) and the JAX adapter from the same gin files, copies the
baseline's initial variables into the JAX parameters, feeds both the same batches and
prints each step's losses and relative difference. Exits 1 when step 0 differs by
more than --first_step_rtol or any step by more than --rtol: then the two systems do
not train the same function and their throughputs are not comparable.
"""

import sys

from absl import app
from absl import flags

from tf_tput import config, data, systems, topology as topology_lib
from tf_tput.errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable): a model, a mesh, ...")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_integer("num_cpu_devices", None, "Virtual CPU devices for both systems.")
flags.DEFINE_integer("steps", 10, "Steps to compare.")
flags.DEFINE_float("first_step_rtol", 1e-5, "Tolerance on step 0 (same weights, same "
                   "batch: only the arithmetic differs).")
flags.DEFINE_float("rtol", 1e-3, "Tolerance on every step (optimizer updates included).")


def compare(experiment, num_cpu_devices, steps: int) -> list:
  """[(step, tf loss, jax loss, relative difference)] over `steps` shared batches."""
  tf_system, jax_system = systems.load("mtf"), systems.load("jax")
  baseline = tf_system.build(experiment,
                             topology_lib.resolve("tf", num_cpu_devices))
  adapter = jax_system.build(experiment, topology_lib.resolve("jax", num_cpu_devices))
  try:
    adapter.load_variables(baseline.export_variables())
    rows = []
    batches = data.batches(experiment)
    for step in range(steps):
      batch = next(batches)
      tf_loss, jax_loss = baseline.step(batch), adapter.step(batch)
      rows.append((step, tf_loss, jax_loss, abs(jax_loss - tf_loss) / abs(tf_loss)))
    return rows
  finally:
    baseline.close()
    adapter.close()


def main(argv) -> int:
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  try:
    if not FLAGS.gin_file:
      raise UsageError("no --gin_file given; pass a model, e.g. "
                       "--gin_file=gin/models/t5_tiny.gin")
    experiment = config.load_experiment(FLAGS.gin_file, FLAGS.gin_param)
    config.validate(experiment, num_devices=FLAGS.num_cpu_devices or 1)
    if FLAGS.steps < 1:
      raise UsageError(f"--steps={FLAGS.steps}; it must be >= 1")
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  rows = compare(experiment, FLAGS.num_cpu_devices, FLAGS.steps)
  print(f"{experiment.model.name}, mesh {experiment.mesh.mesh_shape}, "
        f"{experiment.model.activation_dtype}: mtf vs jax from the same initial weights")
  print(f"{'step':>4}  {'mtf loss':>12}  {'jax loss':>12}  {'rel diff':>9}")
  worst = []
  for step, tf_loss, jax_loss, rel in rows:
    limit = FLAGS.first_step_rtol if step == 0 else FLAGS.rtol
    flag = "" if rel <= limit else f"  > {limit:g}"
    if flag:
      worst.append(step)
    print(f"{step:>4}  {tf_loss:>12.6f}  {jax_loss:>12.6f}  {rel:>9.2e}{flag}")
  if worst:
    print(f"error: steps {worst} exceed the tolerance (step 0: {FLAGS.first_step_rtol:g}, "
          f"others: {FLAGS.rtol:g}); the systems do not train the same function",
          file=sys.stderr)
    return 1
  print(f"parity: all {len(rows)} steps within tolerance "
        f"(step 0 <= {FLAGS.first_step_rtol:g}, others <= {FLAGS.rtol:g})")
  return 0


if __name__ == "__main__":
  app.run(main)
