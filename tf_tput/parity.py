r"""Same weights, same batches, several trainers: a per-step loss table.

    python -m tf_tput.parity --gin_file=gin/models/t5_tiny.gin \
        [--mesh=gin/mesh/data2_model2.gin | --mesh='batch:2;model:2'] [--steps=10]
    python -m tf_tput.parity --gin_file=gin/models/decoder_tiny.gin \
        --gin_file=gin/pipeline/s2_m8.gin --mesh='batch:2' \
        --systems=mtf:unpipelined,mtf,jax:unpipelined,jax

Builds each --systems entry from the same gin files (SYSTEM:unpipelined is the same
model without its pipeline, on the same devices: tf_tput.config.unpipelined), copies
the first entry's initial variables into the others, feeds all the same batches and
prints each step's losses and their relative difference from the first. Exits 1 when
step 0 differs by more than --first_step_rtol or any step by more than --rtol: then
they do not train the same function and their throughputs are not comparable.
"""

import dataclasses
import sys
from typing import Optional

from absl import flags

from tf_tput import config, data, entry, errors, systems
from tf_tput.errors import UsageError

UNPIPELINED = ":unpipelined"

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable): a model, a mesh, ...")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_string("mesh", None, "A mesh file (gin/mesh/data2_model2.gin) or a "
                    "mesh_shape ('batch:2;model:2'); sets --num_cpu_devices to its size "
                    "unless given.")
flags.DEFINE_list("systems", ["mtf", "jax"], "Trainers to compare, the first the "
                  f"reference: system names, each optionally with {UNPIPELINED} (the "
                  "same model without its pipeline).")
flags.DEFINE_integer("num_cpu_devices", None, "Virtual CPU devices for every system.")
flags.DEFINE_integer("steps", 10, "Steps to compare.")
flags.DEFINE_float("first_step_rtol", 1e-5, "Tolerance on step 0 (same weights, same "
                   "batch: only the arithmetic differs).")
flags.DEFINE_float("rtol", 1e-3, "Tolerance on every step (optimizer updates included).")


@dataclasses.dataclass(frozen=True)
class ParityRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  gin_file: tuple
  gin_param: tuple
  mesh: Optional[str]
  systems: tuple
  num_cpu_devices: Optional[int]
  steps: int
  first_step_rtol: float
  rtol: float


def parse_sides(entries, experiment) -> list:
  """[(label, system name, experiment)] of --systems entries, checked."""
  if len(entries) < 2:
    raise UsageError(f"--systems={','.join(entries)} names one trainer; compare at least "
                     "two, e.g. --systems=mtf,jax")
  sides = []
  for asked in entries:
    name, _, variant = asked.partition(":")
    systems.check_name(name)
    if variant and f":{variant}" != UNPIPELINED:
      raise UsageError(f"--systems entry {asked!r}: {variant!r} is not a variant; write "
                       f"{name} or {name}{UNPIPELINED}")
    if variant and not experiment.pipelined:
      raise UsageError(f"--systems entry {asked!r}: the config has no pipeline; add a "
                       "gin/pipeline/ file or drop the suffix")
    chosen = config.unpipelined(experiment) if variant else experiment
    systems.check_experiment(name, chosen)
    sides.append((asked, name, chosen))
  if len(set(entries)) < len(entries):
    raise UsageError(f"--systems={','.join(entries)} names a trainer twice")
  return sides


def compare(sides, num_cpu_devices, steps: int) -> list:
  """[(step, [loss of each side], [relative difference from the first])]."""
  topologies, trainers = {}, []
  try:
    for _, name, experiment in sides:
      runtime = systems.load(name).runtime
      if runtime.name not in topologies:  # virtual devices are configured once per process
        topologies[runtime.name] = _resolve(runtime, name, num_cpu_devices)
      trainers.append(systems.load(name).build(experiment, topologies[runtime.name]))
    try:  # optional Trainer members (their defaults raise): a plugin may lack them
      initial = trainers[0].export_variables()
      for trainer in trainers[1:]:
        trainer.load_variables(initial)
    except NotImplementedError as e:
      raise UsageError(f"--systems: {e}, which parity needs to start every trainer "
                       "from the same weights; implement export_variables and "
                       "load_variables (docs/extending.md)") from None
    rows = []
    batches = data.batches(sides[0][2])  # the batch does not depend on mesh or pipeline
    try:
      for step in range(steps):
        batch = next(batches)
        losses = [trainer.step(batch) for trainer in trainers]
        rows.append((step, losses, [abs(x - losses[0]) / abs(losses[0]) for x in losses]))
    finally:
      batches.close()  # a tfds prefetch thread
    return rows
  finally:
    for trainer in reversed(trainers):
      trainer.close()


def _resolve(runtime, name: str, num_cpu_devices):
  """The runtime's devices; one where it holds one device per process (a trainer
  that joins processes): there it trains the same global batch on one device, the
  reference for the others' split of it."""
  try:
    return runtime.resolve(num_cpu_devices)
  except UsageError as e:
    if not num_cpu_devices or num_cpu_devices == 1:
      raise
    print(f"{name}: one device in this process ({e}); it trains the whole global "
          "batch there", file=sys.stderr)
    return runtime.resolve(None)


def _experiment(request: ParityRequest):
  files, bindings = list(request.gin_file), list(request.gin_param)
  if request.mesh:
    if request.mesh.endswith(".gin"):
      files.append(request.mesh)
    else:
      bindings.append(f"MeshConfig.mesh_shape = {request.mesh!r}")
  names = [asked.partition(":")[0] for asked in request.systems]
  experiment = config.load_experiment(files, bindings, systems.options(*names))
  num_devices = request.num_cpu_devices or experiment.num_devices
  config.validate(experiment, num_devices=num_devices)
  if request.steps < 1:
    raise UsageError(f"--steps={request.steps}; it must be >= 1")
  return experiment, num_devices


def run(request: ParityRequest) -> int:
  experiment, num_devices = _experiment(request)
  sides = parse_sides(request.systems, experiment)
  rows = compare(sides, num_devices if num_devices > 1 else None, request.steps)
  labels = [label for label, _, _ in sides]
  print(f"{experiment.model.name}, mesh {experiment.mesh.mesh_shape}"
        + (f" per stage, {experiment.pipeline.stages} stages x "
           f"{experiment.pipeline.micro_batches} micro-batches" if experiment.pipelined
           else "") + f", {experiment.model.activation_dtype}: {', '.join(labels)} from "
        f"{labels[0]}'s initial weights; rel diff is from {labels[0]}")
  width = max(12, *map(len, labels))
  print(f"{'step':>4}  " + "  ".join(f"{label:>{width}}" for label in labels) + "  "
        + "  ".join(f"{'rel ' + label:>{max(9, len(label) + 4)}}" for label in labels[1:]))
  over = []
  for step, losses, rels in rows:
    limit = request.first_step_rtol if step == 0 else request.rtol
    flag = "" if max(rels) <= limit else f"  > {limit:g}"
    if flag:
      over.append(step)
    print(f"{step:>4}  " + "  ".join(f"{x:>{width}.6f}" for x in losses) + "  "
          + "  ".join(f"{r:>{max(9, len(label) + 4)}.2e}" for r, label in
                      zip(rels[1:], labels[1:], strict=True)) + flag)
  if over:
    print(f"error: steps {over} exceed the tolerance (step 0: "
          f"{request.first_step_rtol:g}, others: {request.rtol:g}); they do not train "
          "the same function", file=sys.stderr)
    return 1
  print(f"parity: all {len(rows)} steps within tolerance "
        f"(step 0 <= {request.first_step_rtol:g}, others <= {request.rtol:g})")
  return 0


def main(argv) -> int:
  request = ParityRequest(
      gin_file=tuple(FLAGS.gin_file), gin_param=tuple(FLAGS.gin_param), mesh=FLAGS.mesh,
      systems=tuple(FLAGS.systems), num_cpu_devices=FLAGS.num_cpu_devices,
      steps=FLAGS.steps, first_step_rtol=FLAGS.first_step_rtol, rtol=FLAGS.rtol)
  return errors.run_entry_point(lambda: run(request), argv)


if __name__ == "__main__":
  entry.start(main)
