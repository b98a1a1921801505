"""How a run's mesh splits across islands (tf_tput.launch --islands), checked before
any framework starts: by train's preflight, a suite's validation and tf_tput.plan.

Across islands a run is data parallel over the island axis, or a pipeline whose
stages split across them; the islands themselves (network namespaces joined by
shaped links) are runtime/islands.py's, the bytes that cross them reduction.py's.
`experiment` is a config.Experiment, read and never imported.
"""

import re
from typing import Optional

from tf_tput import GIN_DIR
from tf_tput.errors import UsageError

# Every way a System's islands may split a run (its `islands`): data parallel inside
# islands, the model split inside them, a pipeline's stages across them.
PARALLELISMS = ("data", "model", "pipeline")


def check_mesh(experiment, num_islands: int, parallelism=("data",),
               num_devices: Optional[int] = None) -> None:
  """Across islands the run is data parallel over the island axis: the batch axis
  splits across islands. Inside each island it is data parallel too, or, where the
  system splits the model inside islands ("model" in its parallelism, mtf), any
  other axes follow the batch axis, so that each island holds a block of the mesh.
  A pipeline ("pipeline" in the parallelism) splits its stages across the islands
  instead: S/K consecutive stages each, so K-1 stage boundaries lie on the links.
  num_devices: the devices the launched processes run, where known (--num_cpu_devices
  x processes); a mesh that does not split names a batch-only mesh of that size."""
  if experiment.pipelined:
    stages = experiment.pipeline.stages
    if "pipeline" not in parallelism:
      raise UsageError(f"{num_islands} islands with PipelineConfig.stages = {stages}: "
                       "this system is data parallel across islands; drop the pipeline")
    if stages % num_islands:
      raise UsageError(f"PipelineConfig.stages = {stages} across {num_islands} islands: "
                       "each island holds an equal run of stages; choose stages that "
                       f"are a multiple of {num_islands}")
    return
  axis = experiment.layout.get("batch", "batch")
  other = {a: n for a, n in experiment.mesh_shape.items() if a != axis and n > 1}
  if other and "model" not in parallelism:
    raise UsageError(f"mesh_shape {experiment.mesh.mesh_shape!r} across {num_islands} "
                     f"islands: islands are data parallel inside too, but axes {other} "
                     f"split the model; use a batch-only mesh such as 'batch:"
                     f"{experiment.num_devices}', or a system that splits the model inside "
                     "islands (docs/islands.md)")
  if other and next(iter(experiment.mesh_shape)) != axis:
    raise UsageError(f"mesh_shape {experiment.mesh.mesh_shape!r} across {num_islands} "
                     f"islands: the batch axis {axis!r} must come first, so that each "
                     f"island holds a block of the mesh; write e.g. '{axis}:"
                     f"{experiment.mesh_shape.get(axis, 1)};"
                     + ";".join(f"{a}:{n}" for a, n in experiment.mesh_shape.items()
                                if a != axis) + "'")
  if experiment.mesh_shape.get(axis, 1) % num_islands:
    used = experiment.num_devices
    problem = (f"batch axis {axis!r} does not split into {num_islands} islands; the "
               f"mesh is {experiment.mesh.mesh_shape!r} ({used} device"
               f"{'s' * (used != 1)})")
    if num_devices is None:
      raise UsageError(f"{problem}: pass a mesh over all the run's devices whose batch "
                       f"axis is a multiple of {num_islands}, such as "
                       f"{_batch_mesh(axis, num_islands)} ({num_islands} devices)")
    runs = f"{'but' if num_devices != used else 'and'} {num_devices} devices run"
    if num_devices % num_islands:
      raise UsageError(f"{problem} {runs}, which do not split into {num_islands} "
                       f"islands: run a multiple of {num_islands} devices with a "
                       "batch-only mesh of as many, such as "
                       f"{_batch_mesh(axis, num_islands)} ({num_islands} devices)")
    raise UsageError(f"{problem} {runs}: pass a mesh with {num_devices} devices such as "
                     f"{_batch_mesh(axis, num_devices)}")


def _batch_mesh(axis: str, size: int) -> str:
  """The flag that passes a batch-only mesh of `size` devices: a file of GIN_DIR's
  mesh folder that binds exactly that, else the binding itself."""
  for path in sorted((GIN_DIR / "mesh").glob("*.gin")):
    bound = re.search(r"^MeshConfig\.mesh_shape\s*=\s*['\"]([^'\"]*)['\"]",
                      path.read_text(), re.MULTILINE)
    if bound and bound.group(1).replace(" ", "") == f"batch:{size}":
      return f"--gin_file={path.stem}"
  return f"--gin_param=\"MeshConfig.mesh_shape = '{axis}:{size}'\""


def island_of_stage(stage: int, stages: int, num_islands: int) -> int:
  """A pipeline's stages split across the islands in order, S/K each (check_mesh)."""
  return stage * num_islands // stages
