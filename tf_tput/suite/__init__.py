"""Suites: gin-defined matrices of runs, each run one child process.

A suite file (gin/suites/*.gin) binds `Suite.name` and `Suite.matrices`, a list of
`@TrainMatrix()` / `@MicroMatrix()` references; several matrices of one kind take gin
scopes (`@small/TrainMatrix()`), and unscoped bindings are shared by all of them.
Every matrix is a cross product: a TrainMatrix of systems x models x meshes x
pipelines x global batches x dtypes gives one `python -m tf_tput.train` run per combination, a
MicroMatrix of systems x modes x hosts one `python -m tf_tput.micro` run per
combination.

A run is identified by its key (tf_tput.records.keys): a hash of what decides what
it measures, the content of its gin files and the code version included. The child
stores the same key in its record (`run_key`), so a results file tells which runs
already succeeded and a rerun of the suite skips them; a record without a key
(older code) or with another (an edited gin file, other code) matches nothing.
"""

import dataclasses
import itertools
import json
import pathlib
import sys
from typing import Optional, Sequence

import gin

from tf_tput import GIN_DIR, GIN_PARENT, config, errors, micro, models, pipeline, preflight
from tf_tput import systems
from tf_tput.records import keys, results
from tf_tput.runtime import islands as islands_lib, launchers, topology
from tf_tput.errors import UsageError

SUITES_DIR = GIN_DIR / "suites"
NO_PIPELINE = "none"
TRAIN_MODULE = "tf_tput.train"
MICRO_MODULE = "tf_tput.micro"
LAUNCH_MODULE = preflight.LAUNCH_MODULE


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainMatrix:
  """systems x models x meshes x pipelines x global_batches x dtypes, one
  tf_tput.train run each."""
  models: Sequence[str]                    # gin/models/<name>.gin
  meshes: Sequence[str] = ("single",)      # gin/mesh/<name>.gin (a stage's, pipelined)
  pipelines: Sequence[str] = (NO_PIPELINE,)  # gin/pipeline/<name>.gin
  systems: Sequence[str] = (systems.DEFAULT,)  # tf_tput.systems.REGISTRY names
  global_batches: Sequence[int] = (8,)
  dtypes: Sequence[str] = ("float32",)     # ModelConfig.activation_dtype
  steps: int = 10                          # measured steps
  warmup_steps: int = 2
  num_cpu_devices: Optional[int] = None    # None: the devices train finds (GPU, TPU)
  gin_params: Sequence[str] = ()           # bindings for every run (e.g. lengths)
  # --strategy of the runs of every system that runs under it ("tpu" on Cloud TPUs);
  # the other systems' runs find their devices locally.
  strategy: str = "local"
  # Processes per run (> 1: under tf_tput.launch --num_processes, num_cpu_devices
  # each; a system that does not run as processes gets as many worker servers, its
  # chief the train command, --strategy=multi_worker), split
  # into each of `islands` (network namespaces, needs root) joined at each of
  # `dcn_rates` (runtime/islands.py). Beside more, 1 island is the baseline: its
  # processes on loopback with the same island axis and reduction (--islands=1).
  processes: int = 1
  islands: Sequence[int] = (1,)
  dcn_rates: Sequence[str] = (islands_lib.NO_LIMIT,)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MicroMatrix:
  """systems x modes x hosts, one tf_tput.micro run each (Fig. 5)."""
  systems: Sequence[str] = tuple(micro.SYSTEMS)
  modes: Sequence[str] = micro.MODES
  hosts: Sequence[int] = (1, 2)
  devices_per_host: int = 2
  chain_length: int = 128
  computations: int = 1024                 # per timed repeat
  repeats: int = 5
  timeout_s: float = 600.0                 # tf_tput.micro's limit for one run


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Suite:
  name: str
  matrices: Sequence  # TrainMatrix / MicroMatrix instances (gin @references)


# Record statuses that mean "measured, nothing to redo". A skipped micro run (its
# extra was not installed) is retried: the extra may be there now.
DONE_STATUSES = {results.SCHEMA: ("ok",), results.MICRO_SCHEMA: ("ok", "not_applicable")}

STRATEGY_FLAG = "strategy"
# train flags a suite's --train_flag may not set: they decide what a run measures (the
# run key's arguments, or bindings the suite passes as --gin_param) or where its
# record goes, so the suite file sets them.
KEYED_TRAIN_FLAGS = ("system", "gin_file", "gin_param", "num_cpu_devices", STRATEGY_FLAG,
                     "results", "steps", "warmup_steps", "global_batch")


def check_train_flags(train_flags) -> None:
  for flag in train_flags:
    name = flag.split("=", 1)[0].lstrip("-")
    if not flag.startswith("--") or not name:
      raise UsageError(f"--train_flag={flag} is not a flag; write e.g. "
                       "--train_flag=--tpu=local")
    if name in KEYED_TRAIN_FLAGS:
      raise UsageError(f"--train_flag={flag}: --{name} decides what a run measures; "
                       "set it in the suite file (TrainMatrix) instead")


def record_key(record: dict) -> Optional[str]:
  """The key of the run that wrote `record`; None (matching no run) for records
  written before records stored it."""
  return record.get("run_key")


def done_keys(records: list) -> set:
  return {record_key(r) for r in records
          if r["status"] in DONE_STATUSES[r["schema"]] and record_key(r)}


@dataclasses.dataclass(frozen=True)
class Run:
  module: str        # TRAIN_MODULE | MICRO_MODULE
  flags: dict        # flag -> value (a list repeats the flag); --results is added
  key: str           # tf_tput.records.keys; the child stores it as the record's run_key
  label: str         # for people: "t5_small jax float32 data2_model2 batch 8"
  group: str         # runs expected to take about as long (time-left estimate)
  strategy: str = "local"
  launcher: tuple = ()  # tf_tput.launch flags the run starts under; () for none

  def args(self, results_path: str) -> list:
    out = []
    for name, value in self.flags.items():
      for v in value if isinstance(value, list) else [value]:
        out.append(f"--{name}={v}")
    return out + [f"--results={results_path}"]

  def command(self, results_path: str, train_flags=(), launcher: str = LAUNCH_MODULE
              ) -> list:
    """The child's command line; train_flags (--name=value) go to train runs only;
    launcher: one of LAUNCHERS (srun: a train run as a Slurm job step)."""
    extra = list(train_flags) if self.module == TRAIN_MODULE else []
    launch = ([sys.executable, "-m", LAUNCH_MODULE, *self.launcher, "--"]
              if self.launcher else [])
    if launcher == "srun" and self.module == TRAIN_MODULE:
      launch = srun_prefix(self)
    return [*launch, sys.executable, "-m", self.module, *self.args(results_path), *extra]


# How a suite's runs start (tf_tput.suite --launcher): under tf_tput.launch on this
# machine, or each as a job step of the Slurm job the suite runs in (srun_prefix).
LAUNCHERS = (LAUNCH_MODULE, "srun")
# A task that fails ends its step: its peers would wait in a collective. --label:
# each line of the run's log says which task wrote it.
SRUN = ("srun", "--kill-on-bad-exit=1", "--label")


def step_tasks(run: Run) -> int:
  """The tasks of `run` as a job step of the Slurm job the suite runs in: its
  processes (one for a one-process run); a chief and its worker servers as task 0 and
  the others (runtime/launchers.py, train's worker tasks); every worker of a program
  each worker runs, a task each. UsageError for what a Slurm step cannot be: islands
  (network namespaces of one machine), Ray nodes, workers of several devices."""
  flags = dict(flag.lstrip("-").split("=", 1) for flag in run.launcher)
  if "islands" in flags:
    raise UsageError(f"{run.label}: --launcher=srun cannot make islands (network "
                     "namespaces of one machine); run this suite without --launcher=srun")
  if "num_processes" in flags:
    return int(flags["num_processes"])
  if "num_workers" not in flags:
    return 1
  system = systems.load(run.flags["system"])
  if int(flags.get("devices_per_worker", 1)) > 1 or not (
      system.every_worker or systems.drives_worker_servers(system)):
    raise UsageError(f"{run.label}: --launcher=srun runs a worker server as one task "
                     "with one device, not --system="
                     f"{run.flags['system']}'s {flags['num_workers']} worker(s) of "
                     f"{flags.get('devices_per_worker', 1)} device(s); run this suite "
                     "without --launcher=srun")
  workers = int(flags["num_workers"])
  return workers if system.every_worker else workers + 1


def srun_prefix(run: Run) -> list:
  """What starts `run` as a job step of the Slurm job the suite runs in."""
  return [*SRUN, f"--ntasks={step_tasks(run)}"]


def check_allocation(runs: list, allocation: launchers.SlurmAllocation) -> None:
  """That the Slurm job the suite runs in can start each run as a job step, checked
  before the first starts (srun would refuse the step, and the suite record nothing):
  UsageError naming the run of the most tasks where the job cannot hold it, what it
  needs, and the sbatch options that give it (and so every other run)."""
  room = allocation.max_step_tasks
  if room is None or not runs:
    return
  # The widest run: the options that hold it hold every other.
  tasks, run = max(((step_tasks(r), r) for r in runs), key=lambda pair: pair[0])
  if tasks > room:
    raise UsageError(
        f"run {run.label!r} is a job step of {tasks} tasks and this job has "
        f"{allocation.cpus} CPU(s), room for {room} task(s) of "
        f"{allocation.cpus_per_task} CPU(s): srun would refuse it; submit the suite "
        f"with sbatch --ntasks={tasks}, or add --overcommit to run {tasks} tasks on "
        "fewer CPUs (docs/clusters.md, \"Slurm\")")


def _launches(m: TrainMatrix) -> list:
  """(tf_tput.launch flags, key fields, label) of each islands x rate of a matrix;
  one island is loopback, whatever the rates."""
  if m.processes == 1:
    return [((), None, "")]
  out, seen = [], set()
  for count, rate in itertools.product(m.islands, m.dcn_rates):
    island_axis = count > 1 or len(m.islands) > 1  # 1 island: the baseline's axis
    fields = keys.launch_fields(m.processes, count if island_axis else 0, rate)
    if json.dumps(fields, sort_keys=True) in seen:
      continue
    seen.add(json.dumps(fields, sort_keys=True))
    flags = [f"--num_processes={m.processes}"]
    if count > 1:
      flags += [f"--islands={count}", f"--dcn_rate={rate}"]
    elif count == 1 and len(m.islands) > 1:  # the baseline of an islands matrix
      flags += ["--islands=1"]
    out.append((tuple(flags), fields, f" {m.processes} processes" + (
        f", {count} islands at {rate}" if count > 1 else "")))
  return out


def _as_workers(launcher: tuple, launch: dict, devices: Optional[int],
                system) -> tuple:
  """(launcher, key fields, strategy, --num_cpu_devices) of a run of a system whose
  runtime serves workers, where the matrix asks for processes: as many worker
  servers (TF workers, Ray nodes) with the devices each. The launched command is
  their chief and sees one process of its own, or runs on every worker, each one of
  the run's processes (train's run key). A chief under multi_worker finds the
  workers' devices; one that runs locally (Ray's driver) is told how many."""
  workers = [f"--num_workers={flag.split('=', 1)[1]}" if flag.startswith(
      "--num_processes=") else flag for flag in launcher]
  if devices:
    workers.append(f"--devices_per_worker={devices}")
  processes = launch["processes"] if system.every_worker else 1
  fields = keys.launch_fields(processes, launch["islands"], launch["dcn_rate"])
  if "multi_worker" in system.strategies:
    return tuple(workers), fields, "multi_worker", None
  return tuple(workers), fields, "local", launch["processes"] * (devices or 1)


def _train_runs(m: TrainMatrix, commit: Optional[str]) -> list:
  runs = []
  for model, mesh, pipe, batch, dtype, system, (launcher, launch, where) in (
      itertools.product(m.models, m.meshes, m.pipelines, m.global_batches, m.dtypes,
                        m.systems, _launches(m))):
    flags = {
        "system": system,
        "gin_file": [f"gin/models/{model}.gin", f"gin/mesh/{mesh}.gin"] + (
            [f"gin/pipeline/{pipe}.gin"] if pipe != NO_PIPELINE else []),
        # The matrix's own axes come last, so they win over matrix.gin_params.
        "gin_param": [*m.gin_params, f"ModelConfig.activation_dtype = '{dtype}'",
                      f"TrainConfig.global_batch = {batch}",
                      f"TrainConfig.steps = {m.steps}",
                      f"TrainConfig.warmup_steps = {m.warmup_steps}"],
        "num_cpu_devices": m.num_cpu_devices,
    }
    strategy = m.strategy if m.strategy in systems.load(system).strategies else "local"
    if launcher and systems.load(system).runtime.serves_workers:
      launcher, launch, strategy, flags["num_cpu_devices"] = _as_workers(
          launcher, launch, m.num_cpu_devices, systems.load(system))
      where = where.replace(" processes", " workers")
    if strategy != "local":
      flags[STRATEGY_FLAG] = strategy
    key = keys.run_key(system, flags["gin_file"], flags["gin_param"],
                       flags["num_cpu_devices"], strategy, commit, launch)
    runs.append(Run(TRAIN_MODULE, {k: v for k, v in flags.items() if v is not None}, key,
                    f"{model} {system}{'' if strategy == 'local' else ' ' + strategy} "
                    f"{dtype} {mesh}" + (f" pipeline {pipe}" if pipe != NO_PIPELINE
                                         else "") + f" batch {batch}{where}", model,
                    strategy, launcher))
  return runs


def _micro_runs(m: MicroMatrix, commit: Optional[str]) -> list:
  runs = []
  for hosts, system, mode in itertools.product(m.hosts, m.systems, m.modes):
    flags = {"systems": system, "modes": mode, "hosts": hosts,
             "devices_per_host": m.devices_per_host, "chain_length": m.chain_length,
             "computations": m.computations, "repeats": m.repeats,
             "timeout_s": m.timeout_s, "bare_loop": False}
    key = keys.micro_run_key(system, mode, hosts, m.devices_per_host, m.chain_length,
                             m.computations, 0, commit)  # matmul_n 0: the scalar add
    runs.append(Run(MICRO_MODULE, flags, key,
                    f"micro {system} {mode} {hosts} host(s) x {m.devices_per_host}",
                    f"micro {system} {hosts}"))
  return runs


def expand(suite: Suite) -> list:
  """Every run of the suite, in order, without duplicates."""
  runs, seen = [], set()
  commit = keys.code_version()  # the code the children will run
  for matrix in suite.matrices:
    for run in (_train_runs(matrix, commit) if isinstance(matrix, TrainMatrix)
                else _micro_runs(matrix, commit)):
      if run.key not in seen:
        seen.add(run.key)
        runs.append(run)
  return runs


def available() -> list:
  return sorted(str(p.relative_to(GIN_PARENT)) for p in SUITES_DIR.glob("*.gin"))


def _resolve(name: str) -> pathlib.Path:
  if (SUITES_DIR / f"{name}.gin").is_file():  # --suite=table1_local
    return SUITES_DIR / f"{name}.gin"
  try:
    return config.resolve_gin_file(name)
  except UsageError:
    raise UsageError(f"--suite={name}: no such file; choose one of "
                     f"{', '.join(available())}") from None


def load(name: str) -> Suite:
  """Parses a suite file into a checked Suite (UsageError naming what is wrong)."""
  path = _resolve(name)
  gin.clear_config()
  config.add_gin_search_path()
  config.check_includes(path)
  try:
    gin.parse_config_file(str(path))
    suite = Suite()
  except TypeError as e:  # a required field left unbound
    raise UsageError(f"{name}: {errors.one_line(e)}; bind Suite.name, Suite.matrices "
                     "and TrainMatrix.models (see gin/suites/table1_local.gin)") from None
  except (ValueError, SyntaxError, AttributeError, NameError, KeyError) as e:
    raise UsageError(f"{name}: {errors.one_line(e)}; the fields are those of Suite, "
                     "TrainMatrix and MicroMatrix in tf_tput/suite/__init__.py") from None
  finally:
    gin.clear_config()
  _check(suite, name)
  return suite


def _check_list(where: str, field: str, values, allowed=None, kind=str) -> None:
  if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values:
    raise UsageError(f"{where}.{field} = {values!r}; give a non-empty list, "
                     f"e.g. {field} = [{'1' if kind is int else repr('...')}]")
  for value in values:
    if kind is int:
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{where}.{field} has {value!r}; use integers >= 1")
    elif not isinstance(value, str):
      raise UsageError(f"{where}.{field} has {value!r}; use quoted names")
    elif allowed is not None and value not in allowed:
      raise UsageError(f"{where}.{field} has {value!r}; choose from "
                       f"{', '.join(sorted(allowed))}")


def _names(folder: str) -> set:
  return {p.stem for p in (GIN_DIR / folder).glob("*.gin")}


def _check_positive(where: str, field: str, value) -> None:
  if (value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                             or value < 1)):
    raise UsageError(f"{where}.{field} = {value!r}; it must be a number >= 1")


def _check(suite: Suite, name: str) -> None:
  if not isinstance(suite.name, str) or not suite.name:
    raise UsageError(f"{name}: Suite.name = {suite.name!r}; give the suite a name")
  if not isinstance(suite.matrices, (list, tuple)) or not suite.matrices:
    raise UsageError(f"{name}: Suite.matrices = {suite.matrices!r}; give a list such as "
                     "[@TrainMatrix()]")
  for matrix in suite.matrices:
    where = f"{name}: {type(matrix).__name__}"
    if isinstance(matrix, TrainMatrix):
      _check_list(where, "models", matrix.models, _names("models") - {"t5_common",
                                                                     "decoder_common"})
      _check_list(where, "meshes", matrix.meshes, _names("mesh"))
      _check_list(where, "pipelines", matrix.pipelines, _names("pipeline") | {NO_PIPELINE})
      _check_list(where, "systems", matrix.systems, set(systems.REGISTRY))
      _check_list(where, "global_batches", matrix.global_batches, kind=int)
      _check_list(where, "dtypes", matrix.dtypes, set(config.DTYPES))
      if matrix.strategy not in topology.STRATEGIES:
        raise UsageError(f"{where}.strategy = {matrix.strategy!r}; use one of "
                         f"{', '.join(topology.STRATEGIES)}")
      if isinstance(matrix.gin_params, str) or not isinstance(matrix.gin_params,
                                                              (list, tuple)):
        raise UsageError(f"{where}.gin_params = {matrix.gin_params!r}; give a list of "
                         "bindings")
      for field in ("steps", "warmup_steps", "num_cpu_devices", "processes"):
        _check_positive(where, field, getattr(matrix, field))
      _check_list(where, "islands", matrix.islands, kind=int)
      _check_list(where, "dcn_rates", matrix.dcn_rates)
      for rate in matrix.dcn_rates:
        islands_lib.parse_rate(rate)
      if any(matrix.processes % count for count in matrix.islands):
        raise UsageError(f"{where}.islands = {list(matrix.islands)} do not all divide "
                         f"processes = {matrix.processes}; each island gets equal processes")
    elif isinstance(matrix, MicroMatrix):
      _check_list(where, "systems", matrix.systems, set(micro.SYSTEMS))
      _check_list(where, "modes", matrix.modes, set(micro.MODES))
      _check_list(where, "hosts", matrix.hosts, kind=int)
      for field in ("devices_per_host", "chain_length", "computations", "repeats",
                    "timeout_s"):
        _check_positive(where, field, getattr(matrix, field))
      if matrix.computations % matrix.chain_length:
        raise UsageError(f"{where}.computations = {matrix.computations} is not a "
                         f"multiple of chain_length = {matrix.chain_length}")
    else:
      raise UsageError(f"{name}: Suite.matrices holds {matrix!r}; use @TrainMatrix() "
                       "or @MicroMatrix() references")


def _launched(run: Run) -> tuple:
  """(processes, islands) the run's tf_tput.launch flags ask for; (1, 0) without.
  Under worker servers (--num_workers) the train command is one process, their chief."""
  values = dict(flag.lstrip("-").split("=", 1) for flag in run.launcher)
  return int(values.get("num_processes", 1)), int(values.get("islands", 0))


def _workers(run: Run) -> Optional[tuple]:
  """(workers, devices per worker) of a run under tf_tput.launch --num_workers."""
  values = dict(flag.lstrip("-").split("=", 1) for flag in run.launcher)
  if "num_workers" not in values:
    return None
  return int(values["num_workers"]), int(values.get("devices_per_worker", 1))


def validate(run: Run) -> str:
  """Checks a train run as tf_tput.train would before starting a framework (its
  preflight.check_shape, with the processes, islands and devices the run will have);
  returns what it would train (tf_tput.models arithmetic). UsageError names the run."""
  if run.module != TRAIN_MODULE:
    return " ".join(run.args("...")[:-1])
  system = run.flags["system"]
  num_processes, num_islands = _launched(run)
  try:
    with config.quiet_include_probes():
      experiment = config.load_experiment(run.flags["gin_file"], run.flags["gin_param"],
                                          systems.options(system))
    preflight.check_shape(system, experiment, strategy=run.strategy,
                          num_processes=num_processes, num_islands=num_islands,
                          num_cpu_devices=run.flags.get("num_cpu_devices"),
                          workers=_workers(run))
  except preflight.StrategyError as e:  # train's words; the suite file's are its fields
    raise UsageError(f"run {run.label!r}: {e} (in the suite file: TrainMatrix.dtypes, "
                     "strategy, num_cpu_devices)") from None
  except preflight.OneProcessError:  # the matrix's processes, not a launcher's
    raise UsageError(f"run {run.label!r}: --system={system} runs as one process, not "
                     "under tf_tput.launch --num_processes (TrainMatrix.processes)") from None
  except preflight.NoIslandsError:
    raise UsageError(f"run {run.label!r}: --system={system} does not train across "
                     "islands") from None
  except UsageError as e:
    raise UsageError(f"run {run.label!r}: {e}") from None
  m, d = experiment.model, experiment.data
  inputs = d.inputs_length if m.arch == "encoder_decoder" else 0
  tokens = experiment.train.global_batch * models.tokens_per_example(
      m, inputs, d.targets_length)
  # The fullest stage's parameters and Adafactor state per device (the whole model's
  # when unpipelined); pipeline.stage_plan also estimates activations.
  state = max(s["param_bytes"] + s["optimizer_bytes"] for s in pipeline.stage_plan(experiment))
  stages = (f", {experiment.pipeline.stages} stages x {experiment.pipeline.micro_batches} "
            "micro-batches" if experiment.pipelined else "")
  return (f"{models.num_params(m):,} params, {experiment.num_devices} devices "
          f"({experiment.mesh.mesh_shape}{' per stage' if stages else ''}{stages}), "
          f"{tokens:,} tokens/step, {state / 2**20:,.1f} MiB params + optimizer state "
          "per device")
