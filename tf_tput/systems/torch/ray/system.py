"""--system=ray: the paper's Ray setup applied to training, a single controller driving
actors. This process (the driver) runs the measured loop; each device is a Ray actor
holding --system=torch's trainer for its rows of the batch, the actors all-reduce
gradients among themselves with torch.distributed (trainer.py). The cluster is
runtime.py's: a private one on loopback, or the one RAY_ADDRESS names.
--system=torch's options hold for the actors (TorchOptions.compile).

Data parallel only: a `batch:N` mesh over N actors. A model axis is mtf's or jax's.
"""

from tf_tput import systems
from tf_tput.systems.torch import system as torch_system
from tf_tput.systems.torch.ray import runtime as ray_runtime


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
  options = torch_system.SYSTEM.options  # the actors' (TorchOptions)

  def check(self, experiment, strategy: str) -> None:
    """A batch mesh only; the actors' TorchOptions checked."""
    systems.check_data_parallel(self.name, experiment,
                                "each actor holds every variable")
    torch_system.chosen_options()

  def build(self, experiment, topology):
    from tf_tput.systems.torch.ray.trainer import RayTrainer
    self.check(experiment, topology.strategy)
    return RayTrainer(experiment, topology,
                      options={"compile": torch_system.chosen_options().compile})


SYSTEM = RaySystem()
