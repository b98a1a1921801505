"""A run's request checked before any framework starts (check): every flag, the gin
files and the environment the launcher gave, so that what fails here is one error line
and exit 2 with nothing run. A run that passes ends in a record (tf_tput/train.py).

What depends only on the run's shape (its system, config, strategy, and the processes,
islands and devices it will have) is check_shape's, which a suite's --dry_run and
tf_tput.plan call as well, so that all three refuse the same runs; the rest (the
results file, directories, host memory, the live launcher's environment) is train's
alone."""

import dataclasses
import os
from typing import Optional

from absl import logging

from tf_tput import config, data, island_split, systems
from tf_tput.errors import UsageError
from tf_tput.measure import gemm
from tf_tput.records import results
from tf_tput.request import Request
from tf_tput.runtime import launchers, topology as topology_lib


@dataclasses.dataclass(frozen=True)
class Checked:
  """What check() found: the run's experiment, its TPU's address (None: no TPU), the
  lines of --results that are not records, and the compilation cache's directory
  (None: off, or a runtime with none)."""
  experiment: config.Experiment
  tpu_address: Optional[str]
  malformed: list
  cache_dir: Optional[str]


def experiment_of(request: Request) -> config.Experiment:
  return config.load_experiment(request.gin_file, request.bindings(),
                                systems.options(request.system))


# Its several processes (--num_processes) are never a chief and its servers: it starts
# those itself (--num_workers).
LAUNCH_MODULE = launchers.TF_TPUT_LAUNCH

# The longest --cluster_timeout_s (11.6 days): every framework's clock takes it.
MAX_TIMEOUT_S = 1e6


def check_writable_dir(path: str, flag: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK):
      raise PermissionError(13, "Permission denied")
  except OSError as e:
    raise UsageError(f"{flag}={path} is not a writable directory ({e.strerror}); "
                     "choose another") from None


def _check_strategy(request: Request):
  """Checks the --strategy flags before any framework starts (the config's part in
  check_shape; the environment's part the system's runtime checks); the TPU's address
  or None."""
  strategy, system = request.strategy, systems.load(request.system)
  system.runtime.check(strategy, system.every_worker, request.cluster_timeout_s)
  tpu_flags = {"tpu": request.tpu, "tpu_zone": request.tpu_zone,
               "gcp_project": request.gcp_project}
  if request.tpu_type:
    from tf_tput.runtime import tpu
    tpu.kind_from_type(request.tpu_type)
    if strategy != "tpu" and not (strategy == "local" and system.runtime.finds_local_tpus):
      local = [name for name in systems.REGISTRY
               if systems.load(name).runtime.finds_local_tpus]
      raise UsageError(f"--tpu_type applies to TPUs: --strategy=tpu, or on a TPU host "
                       f"--system={' or --system='.join(local)}; not --system="
                       f"{request.system} --strategy={strategy}")
  if strategy != "tpu":
    given = [name for name, value in tpu_flags.items() if value]
    if given:
      raise UsageError(f"--{given[0]} applies to --strategy=tpu, not --strategy={strategy}")
    return None
  from tf_tput.runtime import tpu
  return tpu.address_from_flags(**tpu_flags)


def _check_host_memory(experiment) -> None:
  """The batches are built on this host before the clock starts: refused here when
  they need more memory than the host has, not by an allocation failure later."""
  needed = data.host_bytes(experiment)
  try:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):  # no sysconf: nothing to compare with
    return
  if needed > host:
    t = experiment.train
    raise UsageError(
        f"{config.field_label('TrainConfig.global_batch')} = {t.global_batch}: its batches "
        f"need {needed / 2 ** 30:,.1f} GiB of host memory to build, more than this host's "
        f"{host / 2 ** 30:,.1f} GiB; pass a smaller --global_batch")


# The compilation cache's place under the user's cache directory (XDG base directories:
# $XDG_CACHE_HOME, else ~/.cache); the runtime keeps its own subdirectory there.
CACHE_SUBDIR = os.path.join("tf_tput", "compilation")
CACHE_OFF = ("", "none")  # --compilation_cache_dir values that turn it off


def user_cache() -> str:
  """The user's cache directory (XDG base directories: $XDG_CACHE_HOME, else
  ~/.cache)."""
  base = os.environ.get("XDG_CACHE_HOME", "")
  if not os.path.isabs(base):  # unset, or relative (which the spec says to ignore)
    base = os.path.join(os.path.expanduser("~"), ".cache")
  return base


def _compilation_cache_dir(named: Optional[str]) -> Optional[str]:
  """The compilation cache's directory (None: off), created: a --compilation_cache_dir
  that is not writable is a usage error; the default one, a warning and no cache."""
  if named is not None and named.strip().lower() in CACHE_OFF:
    return None
  if named is not None:
    check_writable_dir(named, "--compilation_cache_dir")
    return named
  path = os.path.join(user_cache(), CACHE_SUBDIR)
  try:
    check_writable_dir(path, "--compilation_cache_dir")
  except UsageError as e:
    logging.warning("running without a compilation cache: %s", e)
    return None
  return path


def check(request: Request) -> Checked:
  """Everything the request and its gin files ask for, checked before any framework
  starts."""
  systems.check_name(request.system)
  experiment = experiment_of(request)
  for name in ("num_cpu_devices", "log_every"):
    if getattr(request, name) is not None and getattr(request, name) < 1:
      raise UsageError(f"--{name}={getattr(request, name)}; it must be >= 1")
  for name in ("cluster_timeout_s", "step_timeout_s"):
    timeout_s = getattr(request, name)
    if timeout_s is not None and not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN too
      raise UsageError(f"--{name}={timeout_s}; it must be > 0 (seconds) and at most "
                       f"{MAX_TIMEOUT_S:g}")
  launch = topology_lib.launched()
  check_shape(request.system, experiment, strategy=request.strategy,
              num_processes=launch.num_processes, launcher=launch.launcher,
              num_islands=topology_lib.launched_islands(),
              num_cpu_devices=request.num_cpu_devices)
  tpu_address = _check_strategy(request)
  gemm.check(systems.load(request.system).runtime, request.strategy,
             experiment.model.activation_dtype, request.gemm)
  if serves(request, systems.load(request.system)):  # a worker server: no record, no peak
    return Checked(experiment, tpu_address, [], None)
  _check_host_memory(experiment)
  writes_record = launch.process_id == 0
  malformed = results.check_appendable(request.results) if writes_record else []
  if request.tensorboard_dir and writes_record:
    check_writable_dir(request.tensorboard_dir, "--tensorboard_dir")
  if request.trace_dir:
    if request.strategy not in systems.load(request.system).traces:
      able = [f"--system={name} --strategy={'|'.join(systems.load(name).traces)}"
              for name in systems.able("traces")]
      raise UsageError(f"--trace_dir: --system={request.system} "
                       f"--strategy={request.strategy}"
                       f" has no trace; tracing runs under {'; '.join(able)}")
    check_writable_dir(request.trace_dir, "--trace_dir")
  for number, problem in malformed:
    logging.warning("%s:%d is not a record (%s); left untouched", request.results, number,
                    problem)
  cache_dir = (_compilation_cache_dir(request.compilation_cache_dir)
               if request.system in systems.able("compilation_cache") else None)
  return Checked(experiment, tpu_address, malformed, cache_dir)


def drives_servers(request: Request, system) -> bool:
  """Whether the system's one process drives worker servers (mtf
  --strategy=multi_worker): under a launcher of several processes (srun, a TF_CONFIG
  job) process 0 is that chief and the others serve it."""
  return _drives_servers(request.strategy, system)


def _drives_servers(strategy: str, system) -> bool:
  return strategy == "multi_worker" and systems.drives_worker_servers(system)


def serves(request: Request, system) -> bool:
  """Whether this process serves as a worker of the chief, process 0."""
  return drives_servers(request, system) and topology_lib.launched_processes()[1] > 0


# check_shape's refusals that a caller asking in other terms (a suite's matrix fields,
# not train's flags and launcher) says in its own words; each is a UsageError, which
# train prints as it is.
class StrategyError(UsageError):
  """What --strategy asks of the system and the config that it cannot do
  (systems.check_strategy)."""


class OneProcessError(UsageError):
  """Several processes for a system that runs as one."""


class NoIslandsError(UsageError):
  """Islands for a system that does not train across them."""


def check_shape(system_name: Optional[str], experiment: config.Experiment, *,
                strategy: str = "local", num_processes: int = 1,
                launcher: str = LAUNCH_MODULE, num_islands: int = 0,
                num_cpu_devices: Optional[int] = None,
                workers: Optional[tuple] = None) -> None:
  """What a run asks of its system, from its shape alone: these arguments and the
  config, no other flag and no environment. tf_tput.train passes what its launcher
  started; a suite's validation, what its matrix will start; tf_tput.plan, no system
  (system_name None: whichever would run it), so only how the mesh splits across
  islands, as the most able system would split it. One UsageError in train's words;
  those a suite says in its matrix's words are the subclasses above.

  num_processes: the processes the train command runs as; launcher: what started them
  (Launch.launcher); num_islands: tf_tput.launch --islands (0: none); num_cpu_devices:
  each process's (--num_cpu_devices); workers: (worker servers, devices each) of
  tf_tput.launch --num_workers where known before they start (a suite's; train's
  chief finds them), else None."""
  if system_name is None:
    if num_islands:
      # No system chosen: the mesh is held to what the most able one could do.
      island_split.check_mesh(experiment, num_islands, island_split.PARALLELISMS)
    return
  system = systems.load(system_name)
  systems.check_experiment(system_name, experiment)
  try:
    systems.check_strategy(system_name, strategy, experiment, num_cpu_devices)
  except UsageError as e:
    raise StrategyError(str(e)) from None
  _check_processes(system_name, system, strategy, num_processes, launcher)
  if num_islands:  # data parallel across them, or a pipeline's stages split across them
    if not system.islands:
      able = [name for name in systems.REGISTRY if systems.load(name).islands]
      raise NoIslandsError(f"--system={system_name} does not train across islands; use "
                           f"--system={' or --system='.join(able)} under tf_tput.launch "
                           "--islands")
    island_split.check_mesh(experiment, num_islands, system.islands,
                            (num_cpu_devices or 0) * num_processes or None)
  if num_cpu_devices is not None:
    config.validate(experiment, num_devices=num_cpu_devices * num_processes,
                    num_processes=num_processes)
  if workers:
    config.validate(experiment, num_devices=workers[0] * workers[1])


def _check_processes(system_name: str, system, strategy: str, num_processes: int,
                     launcher: str) -> None:
  """The processes their launcher starts, against what the system runs as."""
  chief = _drives_servers(strategy, system) and launcher != LAUNCH_MODULE
  if num_processes > 1 and not system.multi_process and not chief:
    raise OneProcessError(
        f"--system={system_name} runs as one process (a single controller), not as "
        f"{num_processes} processes of {launcher}; for a cluster use tf_tput.launch "
        "--num_workers=N -- ... --strategy=multi_worker" + (
            ", or srun with --strategy=multi_worker (task 0 drives the others)"
            if systems.drives_worker_servers(system) else ""))
  if num_processes > 1 and system.every_worker and strategy != "multi_worker":
    raise UsageError(f"--system={system_name} runs as several processes only as the "
                     "workers of tf_tput.launch --num_workers=N with --strategy=multi_worker")
