"""Same weights, same batches, two systems: a per-step loss table.

    python -m tf_tput.parity --gin_file=gin/models/t5_tiny.gin \
        [--mesh=gin/mesh/data2_model2.gin | --mesh='batch:2;model:2'] [--steps=10]

Builds the TF baseline (mtf) and the JAX adapter from the same gin files, copies the
baseline's initial variables into the JAX parameters, feeds both the same batches and
prints each step's losses and relative difference. Exits 1 when step 0 differs by
more than --first_step_rtol or any step by more than --rtol: then the two systems do
not train the same function and their throughputs are not comparable.
"""

import sys

from absl import app
from absl import flags

from tf_tput import config, data, errors, systems
from tf_tput.runtime import topology as topology_lib
from tf_tput.errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable): a model, a mesh, ...")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_string("mesh", None, "A mesh file (gin/mesh/data2_model2.gin) or a "
                    "mesh_shape ('batch:2;model:2'); sets --num_cpu_devices to its size "
                    "unless given.")
flags.DEFINE_integer("num_cpu_devices", None, "Virtual CPU devices for both systems.")
flags.DEFINE_integer("steps", 10, "Steps to compare.")
flags.DEFINE_float("first_step_rtol", 1e-5, "Tolerance on step 0 (same weights, same "
                   "batch: only the arithmetic differs).")
flags.DEFINE_float("rtol", 1e-3, "Tolerance on every step (optimizer updates included).")


def compare(experiment, num_cpu_devices, steps: int) -> list:
  """[(step, tf loss, jax loss, relative difference)] over `steps` shared batches."""
  tf_topology = topology_lib.resolve("tf", num_cpu_devices)
  jax_topology = topology_lib.resolve("jax", num_cpu_devices)
  baseline = systems.load("mtf").build(experiment, tf_topology)
  try:
    adapter = systems.load("jax").build(experiment, jax_topology)
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
      adapter.close()
  finally:
    baseline.close()


def _experiment():
  files, bindings = list(FLAGS.gin_file), list(FLAGS.gin_param)
  if FLAGS.mesh:
    if FLAGS.mesh.endswith(".gin"):
      files.append(FLAGS.mesh)
    else:
      bindings.append(f"MeshConfig.mesh_shape = {FLAGS.mesh!r}")
  experiment = config.load_experiment(files, bindings)
  num_devices = FLAGS.num_cpu_devices or experiment.num_devices
  config.validate(experiment, num_devices=num_devices)
  if FLAGS.steps < 1:
    raise UsageError(f"--steps={FLAGS.steps}; it must be >= 1")
  return experiment, num_devices


def run() -> int:
  experiment, num_devices = _experiment()
  rows = compare(experiment, num_devices if num_devices > 1 else None, FLAGS.steps)
  print(f"{experiment.model.name}, mesh {experiment.mesh.mesh_shape}, "
        f"{experiment.model.activation_dtype}: mtf vs jax from the same initial weights")
  print(f"{'step':>4}  {'mtf loss':>12}  {'jax loss':>12}  {'rel diff':>9}")
  over = []
  for step, tf_loss, jax_loss, rel in rows:
    limit = FLAGS.first_step_rtol if step == 0 else FLAGS.rtol
    flag = "" if rel <= limit else f"  > {limit:g}"
    if flag:
      over.append(step)
    print(f"{step:>4}  {tf_loss:>12.6f}  {jax_loss:>12.6f}  {rel:>9.2e}{flag}")
  if over:
    print(f"error: steps {over} exceed the tolerance (step 0: {FLAGS.first_step_rtol:g}, "
          f"others: {FLAGS.rtol:g}); the systems do not train the same function",
          file=sys.stderr)
    return 1
  print(f"parity: all {len(rows)} steps within tolerance "
        f"(step 0 <= {FLAGS.first_step_rtol:g}, others <= {FLAGS.rtol:g})")
  return 0


def main(argv) -> int:
  return errors.run_entry_point(run, argv)


if __name__ == "__main__":
  app.run(main)
