"""--system=ray: the paper's Ray setup applied to training, a single controller driving
actors. This process (the driver) runs the measured loop; each device is a Ray actor
holding --system=torch's trainer for its rows of the batch, the actors all-reduce
gradients among themselves with torch.distributed (trainer.py). The cluster is
runtime.py's: a private one on loopback, or the one RAY_ADDRESS names.
--system=torch's options hold for the actors (TorchOptions.compile).

Data parallel only: a `batch:N` mesh over N actors. A model axis is mtf's or jax's.
Across tf_tput.launch --islands (one Ray node per island, nodes.py) the actors'
gradients cross the links in their all-reduce's ring.

RayOptions.placement says how the actors are placed on the cluster's nodes (Ray's
placement group strategies): SPREAD (the default) puts one actor per node as far as
the cluster has nodes; `--gin_param="RayOptions.placement='PACK'"` packs them onto as
few nodes as fit them. The binding is in the record (its variant) like TorchOptions.
"""

import dataclasses

import gin

from tf_tput import systems
from tf_tput.errors import UsageError
from tf_tput.systems.torch import system as torch_system
from tf_tput.systems.torch.ray import runtime as ray_runtime

PLACEMENTS = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")  # Ray's strategies


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RayOptions:
  """How --system=ray places its actors."""
  placement: str = "SPREAD"  # the actors' placement group strategy (PLACEMENTS)


def chosen_placement() -> str:
  """RayOptions.placement as bound, checked: UsageError in one line."""
  placement = RayOptions().placement
  if placement not in PLACEMENTS:
    raise UsageError(f"RayOptions.placement = {placement!r}; choose one of "
                     f"{', '.join(PLACEMENTS)}")
  return placement


class RaySystem(systems.System):
  name = "ray"
  runtime = ray_runtime.RUNTIME
  distributions = {"ray": ("ray",), "torch": ("torch",)}
  multi_process = False    # one driver process; tf_tput.launch --num_processes refuses it
  strategies = ("local",)  # the actors come from the Ray cluster, not from a strategy
  every_worker = False
  embeddings = ("one_hot", "gather")
  pipelines = False
  islands = ("data",)      # one Ray node per island (tf_tput.launch --num_workers)
  traces = ()
  options = (*torch_system.SYSTEM.options, RayOptions)  # the actors', their placement

  def check(self, experiment, strategy: str) -> None:
    """A batch mesh only; the actors' TorchOptions and RayOptions checked."""
    systems.check_data_parallel(self.name, experiment,
                                "each actor holds every variable")
    torch_system.chosen_options()
    chosen_placement()

  def build(self, experiment, topology):
    from tf_tput.systems.torch.ray.trainer import RayTrainer
    self.check(experiment, topology.strategy)
    return RayTrainer(experiment, topology,
                      options={"compile": torch_system.chosen_options().compile,
                               "placement": chosen_placement()})


SYSTEM = RaySystem()
