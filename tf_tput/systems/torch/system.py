"""--system=torch: the same gin model in PyTorch, data parallel over processes.

model.py holds the model (jax/model.py's numerics, which are mtf's) and mtf's
Adafactor; trainer.py trains it on one device per process, the processes of
tf_tput.launch --num_processes joined by torch.distributed (runtime.py: gloo on
CPUs, NCCL on GPUs), each computing its rows of the same
global batch, the gradients all-reduced. Only a batch mesh: every process holds
every variable; model parallelism is --system=mtf's or --system=jax's. Across
tf_tput.launch --islands the processes split into the islands in order and the
all-reduce's ring crosses their links (trainer.all_reduce_link_bytes).

Eager by default; `--gin_param=TorchOptions.compile=True` runs the step under
torch.compile. The binding is in the record (its config, and the run key a suite
resumes by). This module imports no torch: it is loaded to list the systems.
"""

import dataclasses
import os
import shutil

import gin

from tf_tput import systems
from tf_tput.errors import UsageError
from tf_tput.systems.torch import runtime as torch_runtime


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TorchOptions:
  """How --system=torch runs the step."""
  compile: bool = False   # torch.compile the loss (forward, backward) and the update


def cxx_compiler() -> str:
  """The C++ compiler torch inductor builds its CPU kernels with: $CXX, else g++."""
  return os.environ.get("CXX") or "g++"


def chosen_options() -> TorchOptions:
  """TorchOptions as bound, checked: UsageError in one line."""
  chosen = TorchOptions()
  if not isinstance(chosen.compile, bool):
    raise UsageError(f"TorchOptions.compile = {chosen.compile!r}; it must be True or False")
  if chosen.compile and not shutil.which(cxx_compiler()):
    raise UsageError(f"TorchOptions.compile = True needs a C++ compiler for "
                     f"torch.compile, and {cxx_compiler()!r} is not on PATH; install "
                     "g++ (or set CXX), or drop the binding to run eager")
  return chosen


class TorchSystem(systems.System):
  name = "torch"
  runtime = torch_runtime.RUNTIME
  distributions = {"torch": ("torch",)}
  multi_process = True     # every launched process runs the same program
  strategies = ("local",)  # processes come from tf_tput.launch --num_processes
  every_worker = False
  embeddings = ("one_hot", "gather")
  pipelines = False
  islands = ("data",)  # processes in islands: gloo's ring crosses the links
  traces = ()
  options = (TorchOptions,)  # bound in gin, recorded in the config (systems.options)

  def check(self, experiment, strategy: str) -> None:
    """A batch mesh only; TorchOptions checked."""
    systems.check_data_parallel(self.name, experiment,
                                "every process holds every variable")
    chosen_options()

  def build(self, experiment, topology):
    self.check(experiment, topology.strategy)
    from tf_tput.systems.torch import trainer as torch_trainer
    trainer = torch_trainer.TorchTrainer(
        experiment, device=topology.handles.get("device", "cpu"),
        rank=topology.handles.get("rank", 0), world_size=topology.num_processes,
        compile=chosen_options().compile)
    if topology.islands > 1:  # tf_tput.launch: consecutive processes share an island
      n, k = topology.num_processes, topology.islands
      trainer.analytic_link_bytes_per_step = torch_trainer.all_reduce_link_bytes(
          experiment, [rank * k // n for rank in range(n)])
    return trainer


SYSTEM = TorchSystem()
