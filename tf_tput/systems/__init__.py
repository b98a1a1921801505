"""Systems under test, behind one interface; shared code asks a System, never names one.

One folder per framework below this package (tensorflow/, jax/, torch/) holds that
framework's runtime.py (a tf_tput.runtime.Runtime) and every system built on it. A
system's module is always system.py, defining SYSTEM: the framework's own system at
the top of its folder (jax/system.py, torch/system.py), each other in a folder of its
own there (tensorflow/mtf/, tensorflow/tf2/, jax/pathways/, torch/ray/), with its
trainers beside it, and its own runtime.py where it brings one (pathways, ray).
Nothing here imports a framework folder except through BUILT_IN.

    class System(Protocol):
      name: str                           # its --system value (REGISTRY's key)
      runtime: Runtime                    # its framework's (tf_tput.runtime.Runtime):
                                          # devices, peak probe, barrier, servers
      distributions: dict                 # record env key -> the installed
                                          # distributions its version is read from
      multi_process: bool                 # runs as several processes of one run, each
                                          # running the program (tf_tput.launch
                                          # --num_processes, or --num_workers where
                                          # every_worker)
      strategies: tuple                   # the --strategy values it runs under
      every_worker: bool                  # multi_worker: every worker runs the program;
                                          # else this process drives the servers
      embeddings: tuple                   # the ModelConfig.embedding values it computes
      pipelines: bool                     # trains PipelineConfig.stages > 1 (pipeline.py)
      islands: tuple                      # across tf_tput.launch --islands: how it
                                          # splits inside an island, () / ("data",)
                                          # / ("data", "model"), and "pipeline" if
                                          # a pipeline's stages split across them
      traces: tuple                       # strategies under which --trace_dir works
                                          # (its trainer implements trace_step)
      options: tuple = ()                 # gin configurables saying how it runs
                                          # (options())
      scans_layers: bool = False          # honours ModelConfig.scan_layers (others
                                          # refuse it, check_strategy)
      caveat: str | None = None           # text every record of it carries (caveat())
      def check(self, experiment, strategy) -> None: ...  # what it cannot train under
                                          # the strategy, as one UsageError (no
                                          # framework started)
      def build(self, experiment, topology) -> Trainer: ...

    class Trainer(Protocol):
      num_params: int                     # counted from the variables it built
      def step(self, batch) -> float: ... # one optimizer step; the loss on the host
      def device_memory_bytes(self) -> int | None: ...
      def close(self) -> None: ...

Every system subclasses System and every trainer Trainer, whose optional members have
their defaults there, so shared code calls them and never asks whether they exist
(tests/unit/test_boundary.py). Trainer's:
- nodes (default ()): a tuple of node names, provenance.this_node's form where it
  can, where a trainer that places its own workers put them (Ray's actors), known
  once built (empty: the record's nodes are the Topology's, which the runtime filled
  when it resolved);
- analytic_link_bytes_per_step (default None): the bytes the trainer's own schedule
  sends between islands per step (mtf's counted reduction, a pipeline's stage
  boundaries; None: train records one float32 gradient per parameter reduced
  hierarchically, reduction.analytic_link_bytes);
- dispatch(batch) -> a loss float() of which waits for the step, and
  synchronous_step (default True: dispatch is step). A trainer whose dispatch
  returns the loss still pending (jax) sets it False: the loop keeps
  TrainConfig.sync_every steps in flight, and records say which (synchronous_step);
- compile(batch), called where compiles_ahead (default False): compiles the step
  ahead of time for batches shaped as the first; the shared loop calls it just before
  the first step and times it (compile_s, jax's trainers); otherwise the first step
  compiles (docs/measurement.md);
- trace_step(batch, path) -> text (where its system lists the strategy in traces):
  one more step under the framework's trace, written to path, saying where the time
  went (--trace_dir);
- export_variables() -> {mtf variable name: numpy array} and load_variables(values)
  (every system's, for tf_tput.parity).
The defaults of trace_step, export_variables and load_variables raise
NotImplementedError.
Modules are imported only when chosen, so choosing a system loads only its framework.
A new system is its system.py in its framework's folder plus its line in BUILT_IN
(a new framework: a new folder shaped like the others), or, outside this tree, a
module an installed distribution names under the entry-point group "tf_tput.systems"
(docs/extending.md).
"""

import dataclasses
import importlib
import importlib.metadata
from typing import Optional, Protocol

from tf_tput.errors import UsageError

# --system value -> module defining SYSTEM.
BUILT_IN = {
    "mtf": "tf_tput.systems.tensorflow.mtf.system",
    "jax": "tf_tput.systems.jax.system",
    "tf2": "tf_tput.systems.tensorflow.tf2.system",
    "torch": "tf_tput.systems.torch.system",
    "pathways": "tf_tput.systems.jax.pathways.system",
    "ray": "tf_tput.systems.torch.ray.system",
}
ENTRY_POINT_GROUP = "tf_tput.systems"  # name = module defining SYSTEM, for plugins


def _plugins() -> dict:
  """Systems installed distributions declare; a built-in name is never replaced."""
  return {ep.name: ep.value.split(":")[0]
          for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
          if ep.name not in BUILT_IN}


REGISTRY = {**BUILT_IN, **_plugins()}
DEFAULT = "mtf"  # the paper's TF baseline: tf_tput.train's --system when none is given


class Trainer(Protocol):
  """What build() returns; trainers subclass it for the defaults of its optional
  members, which shared code calls without probing."""
  num_params: int
  # Where a trainer that places its own workers put them (Ray's actors), once built;
  # () : the Topology's nodes.
  nodes: tuple = ()
  # Bytes its own schedule sends between islands per step; None: one float32 gradient
  # per parameter, reduced hierarchically (reduction.analytic_link_bytes).
  analytic_link_bytes_per_step: Optional[int] = None
  # False where dispatch returns the loss still pending: the loop then keeps
  # sync_every steps in flight, and records say so.
  synchronous_step: bool = True
  # True where compile(batch) compiles the step ahead of time (the loop times it).
  compiles_ahead: bool = False

  def step(self, batch: dict) -> float: ...

  def dispatch(self, batch: dict):
    """One step; a loss float() of which waits for it (pending where not
    synchronous_step)."""
    return float(self.step(batch))

  def compile(self, batch: dict) -> None:
    """Only where compiles_ahead: the step compiled for batches shaped as `batch`."""

  def trace_step(self, batch: dict, path: str) -> str:
    """Only where its system lists the strategy in traces (--trace_dir)."""
    raise NotImplementedError(f"{type(self).__name__} has no trace_step")

  def export_variables(self) -> dict:
    """{mtf variable name: numpy array}, for tf_tput.parity."""
    raise NotImplementedError(f"{type(self).__name__} has no export_variables")

  def load_variables(self, values: dict) -> None:
    """Replaces the variables with export_variables()'s form, for tf_tput.parity."""
    raise NotImplementedError(f"{type(self).__name__} has no load_variables")

  def device_memory_bytes(self) -> Optional[int]: ...

  def close(self) -> None: ...


class System(Protocol):
  """What a system module's SYSTEM is an instance of; systems subclass it for the
  defaults of its optional members, which shared code reads without probing."""
  name: str
  runtime: object  # a tf_tput.runtime.Runtime
  distributions: dict
  multi_process: bool
  strategies: tuple
  every_worker: bool
  embeddings: tuple
  pipelines: bool
  islands: tuple
  traces: tuple
  options: tuple = ()  # gin configurables saying how it runs (options())
  scans_layers: bool = False  # honours ModelConfig.scan_layers
  caveat: Optional[str] = None  # what every record of it must tell a reader

  def check(self, experiment, strategy: str) -> None: ...

  def build(self, experiment, topology) -> Trainer: ...


def check_name(name: str) -> None:
  if name not in REGISTRY:
    raise UsageError(f"--system={name} is not a system; choose one of "
                     f"{', '.join(sorted(REGISTRY))}")


def load(name: str) -> System:
  check_name(name)
  system = importlib.import_module(REGISTRY[name]).SYSTEM
  # Shared code calls the members the base classes declare: a plugin that does not
  # subclass them would fail later, inside a run, on a member it lacks.
  from tf_tput.runtime import Runtime
  if System not in type(system).__mro__ or Runtime not in type(system.runtime).__mro__:
    raise UsageError(f"--system={name}: {REGISTRY[name]}.SYSTEM must be a "
                     "tf_tput.systems.System and its runtime a tf_tput.runtime.Runtime; "
                     "subclass them (docs/extending.md)")
  return system


def drives_worker_servers(system: System) -> bool:
  """Whether the system's one process drives TF worker servers under
  --strategy=multi_worker (its runtime's chief_drives_workers: each other process
  serves, serve_worker), rather than every worker running the program."""
  return not system.every_worker and system.runtime.chief_drives_workers


# The System members messages list the able systems by, each read as declared.
ABILITIES = {"traces": lambda system: system.traces,
             "islands": lambda system: system.islands,
             "scans_layers": lambda system: system.scans_layers,
             "compilation_cache": lambda system: system.runtime.keeps_compilation_cache}


def able(ability: str) -> list:
  """The registered systems whose ABILITIES[ability] is true (non-empty), for
  messages."""
  return [name for name in REGISTRY if ABILITIES[ability](load(name))]


def distributions() -> dict:
  """Every registered system's env key -> distributions: each record carries the
  versions of them all, so records of different systems compare their libraries."""
  out = {}
  for name in REGISTRY:
    out.update(load(name).distributions)
  return out


def probe_distributions(system: System) -> dict:
  """The distributions whose versions key the system's kept peak probes: its runtime's
  framework's where the runtime names them (the systems on one framework share its
  probes), else the system's own."""
  return system.runtime.distributions or system.distributions


def named_in(command, default: Optional[str] = DEFAULT) -> Optional[str]:
  """The --system value a tf_tput.train command line gives (absl's --system=X,
  --system X, -system=X), else `default`."""
  for i, arg in enumerate(command):
    for prefix in ("--system", "-system"):
      if arg.startswith(prefix + "="):
        return arg.split("=", 1)[1]
      if arg == prefix and i + 1 < len(command):
        return command[i + 1]
  return default


def options(*names: str) -> tuple:
  """The gin configurables of these systems (System.options: how the system runs,
  bound in gin and recorded in the config), their modules imported so that gin knows
  their names before it parses."""
  return tuple(dict.fromkeys(c for name in names for c in load(name).options))


def variant(name: str, experiment) -> Optional[str]:
  """How the run differs from the system's default way of computing the config's
  arithmetic, as bindings (the record's `variant`): its options' values that are not
  their defaults, and scanned layers; None for the default way. Read while the
  run's gin config is the parsed one."""
  bound = []
  for configurable in options(name):
    chosen = configurable()
    bound += [f"{configurable.__name__}.{f.name}={getattr(chosen, f.name)!r}"
              for f in dataclasses.fields(chosen) if getattr(chosen, f.name) != f.default]
  if experiment.model.scan_layers:
    bound.append("ModelConfig.scan_layers=True")
  return ", ".join(bound) or None


def caveat(name: str) -> Optional[str]:
  """What the system says every record of it must tell a reader (e.g. that tf_tput
  never exercised its path); None when nothing."""
  return load(name).caveat


def check_data_parallel(name: str, experiment, why: str) -> None:
  """For a system that holds every variable on every device (`why` says how): a mesh
  axis of size > 1 that does not split the batch is model parallelism, refused in
  one UsageError line naming the systems that have it."""
  batch_axis = experiment.layout.get("batch")
  other = {axis: size for axis, size in experiment.mesh_shape.items()
           if size > 1 and axis != batch_axis}
  if other:
    axes = ";".join(f"{axis}:{size}" for axis, size in other.items())
    raise UsageError(
        f"--system={name} is data parallel only ({why}) but mesh "
        f"{experiment.mesh.mesh_shape!r} has {axes} beyond the batch axis; use a "
        f"batch-only mesh such as 'batch:{experiment.num_devices}', or --system=mtf "
        "or --system=jax for model parallelism")


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


def check_strategy(name: str, strategy: str, experiment,
                   num_cpu_devices: Optional[int] = None) -> None:
  """What --strategy asks of the system and the config, checked the same way by
  tf_tput.train and a suite's validation (the environment's part is the runtime's)."""
  system = load(name)
  # Here, not in check_experiment: tf_tput.parity compares a scanned system with
  # unscanned ones (scanning keeps the arithmetic), train and suites refuse it.
  if experiment.model.scan_layers and not system.scans_layers:
    raise UsageError(f"ModelConfig.scan_layers = True: --system={name} runs the layers "
                     f"one by one; drop the binding, or use --system="
                     f"{' or --system='.join(able('scans_layers'))}")
  if strategy not in system.strategies:
    raise UsageError(f"--strategy={strategy} is not one --system={name} runs under; "
                     f"it runs under {', '.join(system.strategies)}" + (
                         " (processes come from tf_tput.launch --num_processes)"
                         if system.strategies == ("local",) else ""))
  if strategy != "local" and num_cpu_devices is not None:
    raise UsageError(f"--num_cpu_devices applies to --strategy=local; with {strategy} the "
                     "devices come from the cluster (tf_tput.launch --devices_per_worker)")
  if strategy == "tpu" and experiment.model.activation_dtype != "bfloat16":
    raise UsageError(f"--strategy=tpu trains in bfloat16 activations (the MXU's type), "
                     f"not {experiment.model.activation_dtype}; add "
                     "--gin_param=\"ModelConfig.activation_dtype='bfloat16'\"")
  system.check(experiment, strategy)
