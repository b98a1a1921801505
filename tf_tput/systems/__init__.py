"""Systems under test, behind one interface; the measured loop never sees which.

    class System(Protocol):
      name: str
      framework: str                      # which topology resolver it needs ("tf", "jax")
      multi_process: bool                 # can run as several launched processes
      strategies: tuple                   # the --strategy values it runs under
      every_worker: bool                  # multi_worker: every worker runs the program
                                          # (tf2); else this process drives them (mtf)
      embeddings: tuple                   # the ModelConfig.embedding values it computes
      pipelines: bool                     # trains PipelineConfig.stages > 1 (pipeline.py)
      islands: tuple                      # across tf_tput.launch --islands: how it
                                          # splits inside an island, () / ("data",)
                                          # / ("data", "model"), and "pipeline" if
                                          # a pipeline's stages split across them
      def build(self, experiment, topology) -> Trainer: ...

    class Trainer(Protocol):
      num_params: int                     # counted from the variables it built
      def step(self, batch) -> float: ... # one optimizer step; the loss on the host
      def device_memory_bytes(self) -> int | None: ...
      def close(self) -> None: ...

An optional Trainer method dispatch(batch) -> pending loss (float() of it waits for
the step) lets the loop keep TrainConfig.sync_every steps in flight (jax); a trainer
without it has a synchronous step (mtf: Session.run returns when the step is done),
and records say so (synchronous_step).
tf_tput.parity also uses two optional Trainer methods: export_variables() ->
{mtf variable name: numpy array} and load_variables(values) (every system).
Across islands an optional attribute analytic_link_bytes_per_step gives the bytes
the trainer's own schedule sends between them per step (mtf's counted reduction, a
pipeline's stage boundaries); without it, train records one float32 gradient per
parameter reduced hierarchically (runtime/islands.analytic_link_bytes).
Modules are imported only when chosen, so choosing a system loads only its framework.
"""

import importlib
from typing import Optional, Protocol

from tf_tput.errors import UsageError

# --system value -> module defining SYSTEM.
REGISTRY = {
    "mtf": "tf_tput.systems.mtf",
    "jax": "tf_tput.systems.jax_adapter",
    "tf2": "tf_tput.systems.tf2",
}


class Trainer(Protocol):
  num_params: int

  def step(self, batch: dict) -> float: ...

  def device_memory_bytes(self) -> Optional[int]: ...

  def close(self) -> None: ...


class System(Protocol):
  name: str
  framework: str
  multi_process: bool
  strategies: tuple
  every_worker: bool
  embeddings: tuple
  pipelines: bool
  islands: tuple

  def build(self, experiment, topology) -> Trainer: ...


def check_name(name: str) -> None:
  if name not in REGISTRY:
    raise UsageError(f"--system={name} is not a system; choose one of "
                     f"{', '.join(sorted(REGISTRY))}")


def load(name: str) -> System:
  check_name(name)
  return importlib.import_module(REGISTRY[name]).SYSTEM


def check_experiment(name: str, experiment) -> None:
  """What the config asks of the system that it cannot do, as one UsageError."""
  system = load(name)
  embedding = experiment.model.embedding
  if embedding not in system.embeddings:
    raise UsageError(f"ModelConfig.embedding = {embedding!r}: --system={name} computes "
                     f"only {', '.join(system.embeddings)}; drop the binding or choose "
                     "a system that has it")
  if experiment.pipelined and not system.pipelines:
    raise UsageError(f"PipelineConfig.stages = {experiment.pipeline.stages}: --system="
                     f"{name} has no pipeline; use stages = 1 or a system that has one")
