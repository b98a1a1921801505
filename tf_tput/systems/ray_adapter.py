"""--system=ray: the paper's Ray setup applied to training, a single controller driving
actors. This process (the driver) runs the measured loop; each device is a Ray actor
holding --system=torch's trainer for its rows of the batch, the actors all-reduce
gradients among themselves with torch.distributed (ray_trainer.py). The cluster is
frameworks/ray_runtime.py's: a private one on loopback, or the one RAY_ADDRESS names.
--system=torch's options hold for the actors (TorchOptions.compile).

Data parallel only: a `batch:N` mesh over N actors. A model axis is mtf's or jax's.
"""

from tf_tput.errors import UsageError
from tf_tput.frameworks import ray_runtime
from tf_tput.systems import torch_adapter


class RaySystem:
  name = "ray"
  runtime = ray_runtime.RUNTIME
  distributions = {"ray": ("ray",), "torch": ("torch",)}
  multi_process = False    # one driver process; tf_tput.launch --num_processes refuses it
  strategies = ("local",)  # the actors come from the Ray cluster, not from a strategy
  every_worker = False
  embeddings = ("one_hot", "gather")
  pipelines = False
  islands = ()
  traces = ()
  options = torch_adapter.SYSTEM.options  # the actors' (TorchOptions)

  def check(self, experiment, strategy: str) -> None:
    """The mesh must split only the batch: every actor holds every variable."""
    batch_axis = experiment.layout.get("batch")
    other = {axis: size for axis, size in experiment.mesh_shape.items()
             if size > 1 and axis != batch_axis}
    if other:
      axes = ";".join(f"{axis}:{size}" for axis, size in other.items())
      raise UsageError(
          f"--system=ray is data parallel only (each actor holds every variable) but "
          f"mesh {experiment.mesh.mesh_shape!r} has {axes} beyond the batch axis; use a "
          f"batch-only mesh such as 'batch:{experiment.num_devices}', or --system=mtf "
          "or --system=jax for model parallelism")
    torch_adapter.SYSTEM.check(experiment, strategy)  # what the actors' torch refuses

  def build(self, experiment, topology):
    from tf_tput.systems.ray_trainer import RayTrainer
    self.check(experiment, topology.strategy)
    compiled = torch_adapter.chosen_options().compile
    return RayTrainer(experiment, topology, options={"compile": True} if compiled else {})


SYSTEM = RaySystem()
