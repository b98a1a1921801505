r"""One training-throughput run -> one result record.

    python -m tf_tput.train --gin_file=gin/models/t5_small.gin \
        --gin_file=gin/mesh/data2_model2.gin --system=mtf --num_cpu_devices=4 \
        --steps=20 --results=results/runs.jsonl

Everything that can be wrong with the request is checked before any framework
starts; a run that fails after that still appends a record with status "failed".
"""

import dataclasses
import os
import sys
from typing import Optional

from absl import flags
from absl import logging

from tf_tput import config, data, entry, errors, models, pipeline, systems
from tf_tput.measure import gemm, loop, metrics, peak as peak_lib, peak_store
from tf_tput.records import build, keys, provenance, results
from tf_tput.runtime import cpus, host_memory, host_runs, islands, topology as topology_lib
from tf_tput.runtime import watchdog
from tf_tput.errors import UsageError


def _cache_systems() -> list:
  """The systems whose runtime keeps a persistent compilation cache (an optional
  Runtime member, docs/extending.md), named in --compilation_cache_dir's help."""
  return [name for name in systems.REGISTRY
          if systems.load(name).runtime.keeps_compilation_cache]


FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file (repeatable; later files win), "
                          "e.g. gin/models/t5_small.gin and gin/mesh/data2_model2.gin.")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable), applied after "
                          "the files, e.g. \"ModelConfig.activation_dtype='bfloat16'\".")
flags.DEFINE_string("system", systems.DEFAULT, "System under test: "
                    f"{', '.join(systems.REGISTRY)}.")
flags.DEFINE_string("results", "results/runs.jsonl", "JSON-lines file the record is "
                    "appended to (created with its directory).")
flags.DEFINE_integer("num_cpu_devices", None, "Split the host CPU into this many virtual "
                     "devices (they share its cores). Unset: GPUs if present, else 1 CPU.")
flags.DEFINE_integer("steps", None, "Measured steps (overrides TrainConfig.steps).")
flags.DEFINE_integer("warmup_steps", None, "Unmeasured first steps, >= 1 "
                     "(overrides TrainConfig.warmup_steps).")
flags.DEFINE_integer("global_batch", None, "Examples per step over all devices "
                     "(overrides TrainConfig.global_batch).")
flags.DEFINE_enum("strategy", "local", topology_lib.STRATEGIES,
                  "Where the devices are (each system lists the strategies it runs "
                  "under, docs/systems.md). local: this process's (--num_cpu_devices, "
                  "accelerators, or the processes of tf_tput.launch --num_processes). "
                  "multi_worker: the worker servers of a cluster (tf_tput.launch "
                  "--num_workers sets one up on loopback): this process drives them, "
                  "or is one of them where every worker runs the program. tpu: a "
                  "Cloud TPU named by --tpu; NOT exercised by CI or by the tests "
                  "beyond the connection (no TPU there).")
flags.DEFINE_float("cluster_timeout_s", 60.0, "How long to wait for anything outside "
                   "this process to answer before the run fails naming it: the workers "
                   "of a cluster (multi_worker), the other processes under tf_tput.launch "
                   "and their coordinator, a Cloud TPU (tpu).")
flags.DEFINE_string("tpu", None, "tpu: the Cloud TPU's name, grpc://host:8470, or local "
                    "(on a TPU VM).")
flags.DEFINE_string("tpu_type", None, "TPU generation for the MFU peak (v2, v3, v4, v5e, "
                    "v5p; an accelerator type such as v3-32 also works) where the run "
                    "cannot tell it (--tpu=local or an address), or to override the "
                    "device kind a framework reports. Only on TPUs.")
flags.DEFINE_string("tpu_zone", None, "tpu: its GCP zone (unset: from the metadata).")
flags.DEFINE_string("gcp_project", None, "tpu: its GCP project (unset: from the metadata).")
flags.DEFINE_string("tensorboard_dir", None, "Write per-step scalars here.")
flags.DEFINE_string("trace_dir", None, "After the measured steps, run one more step "
                    "under the framework's trace, write it to DIR/<run id>.trace.json and "
                    "print where each device's time went (systems that trace: "
                    f"{', '.join(systems.able('traces'))}).")
flags.DEFINE_integer("log_every", 10, "Log progress every this many measured steps.")
flags.DEFINE_string("compilation_cache_dir", None, "Keep compiled programs here, where "
                    "the system's runtime has a persistent compilation cache (systems "
                    f"that have one: {', '.join(_cache_systems())}), so a "
                    "later run of the same program loads them instead of compiling. "
                    "Unset: $XDG_CACHE_HOME/tf_tput/compilation (~/.cache/tf_tput/"
                    "compilation without XDG_CACHE_HOME). Empty or 'none': off. Records "
                    "say whether the run hit it (compilation_cache).")
flags.DEFINE_bool("reprobe_peak", False, "Measure this CPU's matmul peak (MFU's "
                  "denominator) again, and keep the new one, instead of the probe kept "
                  "in $XDG_CACHE_HOME/tf_tput/peaks.json (~/.cache/tf_tput/ without "
                  "XDG_CACHE_HOME) for this CPU, framework version and dtype.")
flags.DEFINE_string("gemm", gemm.AUTO, "The GEMM path the framework's CPU matmuls "
                    "take, where it has several (docs/systems.md, 'GEMM paths'): "
                    f"'{gemm.AUTO}' is the fastest of their peak probes, each probed "
                    "once per machine and kept beside the peak (a path the runtime "
                    "names only is left out); a name forces that path. Records say "
                    "which ran (env.gemm).")
flags.DEFINE_float("step_timeout_s", None, "End the run as failed, naming the step, "
                   "when a window of the measured loop (sync_every steps) after the "
                   "first has not completed after this many seconds: a hung collective "
                   f"or a stopped peer. The first window, which compiles, gets "
                   f"{watchdog.FIRST_WINDOW_S:g} s (or this, if longer). Unset: "
                   f"{watchdog.FACTOR:g} times the slowest window so far, at least "
                   f"{watchdog.FLOOR_S:g} s.")
flags.DEFINE_bool("keep_freed_memory", True, "Keep freed host memory for reuse (glibc's "
                  "malloc: no mmap, no trim) so a step's temporaries do not fault in "
                  "fresh pages every step; --nokeep_freed_memory leaves the libc's "
                  "default. Records say which (env.host_allocator).")
flags.DEFINE_bool("packed", False, "This run is meant to share its host with other "
                  "measured runs (a packed Slurm array, several suites at once): the "
                  "record says so (packed) and reports mark its concurrent_runs as "
                  "asked for. Without it, another run live on the host at the same "
                  "time is marked as unasked sharing.")

# Flags that override gin bindings; applied as bindings so the recorded config is exact.
FLAG_BINDINGS = {"steps": "TrainConfig.steps", "warmup_steps": "TrainConfig.warmup_steps",
                 "global_batch": "TrainConfig.global_batch"}
OWN_FLAGS = ("gin_file", "gin_param", "system", "strategy", "results", "num_cpu_devices",
             "steps", "warmup_steps", "global_batch", "tensorboard_dir", "trace_dir",
             "log_every", "cluster_timeout_s", "tpu", "tpu_type", "tpu_zone", "gcp_project",
             "compilation_cache_dir", "reprobe_peak", "keep_freed_memory", "step_timeout_s",
             "gemm", "packed")


def _bindings() -> list:
  """--gin_param, then the flags that override bindings: every binding applied."""
  return list(FLAGS.gin_param) + [
      f"{binding} = {FLAGS[name].value}" for name, binding in FLAG_BINDINGS.items()
      if FLAGS[name].value is not None]


def _experiment() -> config.Experiment:
  return config.load_experiment(FLAGS.gin_file, _bindings(), systems.options(FLAGS.system))


@dataclasses.dataclass
class Outcome:
  """What training and measuring produced, whether or not the run succeeded."""
  measurement: loop.Measurement
  num_params: int
  device_memory_bytes: Optional[int] = None
  link_timer: Optional[loop.ProbedTimer] = None  # across islands: bytes between them
  # Bytes a step sends between islands by the trainer's own account (mtf counts what
  # its lowering all-reduces or sends; pipelines count stage boundaries); None: one
  # gradient per parameter, reduced hierarchically (islands.analytic_link_bytes).
  analytic_link_bytes: Optional[int] = None
  # How far the run got (devices, peak probe, batches, build, train, trace, record): a
  # failure is recorded under it.
  stage: str = "devices"
  compilation_cache: Optional[str] = None  # the record's: hit, miss, off, None
  # Where the trainer placed its workers, when it says (its optional `nodes`); else
  # the topology's (the record's nodes).
  nodes: tuple = ()
  # How the run ended when a signal or the watchdog ended it (runtime/watchdog.py).
  ending: Optional[watchdog.Ending] = None
  gemm: Optional[dict] = None  # the record's env.gemm (measure/gemm.py)


def _status(outcome: Outcome) -> tuple:
  """The record's (status, error): an ending's, a failure seen after it appended."""
  error, ending = outcome.measurement.error, outcome.ending
  if ending is None:
    return ("failed" if error else "ok"), error
  return ending.status, ending.error + (f"; then {error}" if error else "")


def _run_key() -> str:
  """The suite's key for this command line (tf_tput.records.keys), taken before the run
  starts: gin files or code edited while it runs must not lend it their key."""
  num_processes, _ = topology_lib.launched_processes()
  if _drives_servers(systems.load(FLAGS.system)):
    num_processes = 1  # the chief, as under tf_tput.launch --num_workers
  launch = keys.launch_fields(num_processes, topology_lib.launched_islands(),
                              os.environ.get(islands.DCN_RATE_ENV, islands.NO_LIMIT))
  return keys.run_key(FLAGS.system, FLAGS.gin_file, _bindings(), FLAGS.num_cpu_devices,
                      FLAGS.strategy, keys.code_version(), launch)


def _record(experiment, topology, outcome: Outcome, summary, peak_source, started_at,
            run_id, run_key: str, concurrent_runs: list) -> dict:
  m, d, t = experiment.model, experiment.data, experiment.train
  measurement = outcome.measurement
  losses = measurement.losses
  status, error = _status(outcome)
  return build.record(results.SCHEMA, {
      "system": FLAGS.system,
      "strategy": topology.strategy,
      "model": m.name, "arch": m.arch,
      "num_params": outcome.num_params, "mesh_shape": experiment.mesh.mesh_shape,
      "layout": experiment.mesh.layout, "num_devices": topology.num_devices,
      "num_processes": topology.num_processes,
      **_launch_fields(),
      "concurrent_runs": concurrent_runs, "packed": FLAGS.packed,
      **build.node_fields(outcome.nodes or topology.nodes),  # the trainer's, else resolve's
      "global_batch": t.global_batch,
      "inputs_length": d.inputs_length if m.arch == "encoder_decoder" else None,
      "targets_length": d.targets_length, "dtype": m.activation_dtype,
      "embedding": m.embedding, "variant": systems.variant(FLAGS.system, experiment),
      "caveat": systems.caveat(FLAGS.system), **pipeline.record_fields(experiment),
      **_island_fields(experiment, outcome, topology.num_devices),
      "steps": t.steps, "warmup_steps": t.warmup_steps,
      "sync_every": t.sync_every, "synchronous_step": measurement.synchronous_step,
      "compilation_cache": outcome.compilation_cache,
      **summary,
      "peak_source": peak_source, "device_memory_bytes": outcome.device_memory_bytes,
      "steps_measured": len(measurement.tokens),
      "window_s": measurement.window_durations,
      "signal": outcome.ending.signal if outcome.ending else None,
      "losses": losses, "final_loss": losses[-1] if losses else None,
      "config": experiment.operative_config,
      "flags": {name: FLAGS[name].value for name in OWN_FLAGS},
      "run_key": run_key,
  }, topology.describe(), systems.distributions(), status=status, error=error,
      run_id=run_id, started_at=started_at, env_fields={
          "gemm": outcome.gemm, "cpu_affinity": cpus.as_list(cpus.allowed()),
          "cpu_binding": topology_lib.launched().cpu_binding})


def _launch_fields() -> dict:
  """How the run was started (runtime/launchers.py): its launcher and job."""
  launch = topology_lib.launched()
  return {"launcher": launch.launcher, "job_id": launch.job_id,
          "array_job_id": launch.array_job_id, "array_task_id": launch.array_task_id}


def _summary_lines(record: dict, path: str, line: int) -> list:
  st, mfu = record["step_time_s"], record["mfu"]
  tokens = (f"tokens/s {record['tokens_per_sec']:,.1f} (padded "
            f"{record['padded_tokens_per_sec']:,.1f})" if record["tokens_per_sec"]
            else "tokens/s n/a")
  spread = (f"step time median {st['median']:.4f}s [p10 {st['p10']:.4f}, p90 "
            f"{st['p90']:.4f}]" if st["median"] is not None else "step time n/a")
  # The peak in a few words; the record's peak_source keeps the whole text.
  peak, source = record["peak_flops_per_device"], peak_lib.short_source(record["peak_source"])
  per_device = f"{peak_lib.flops_label(peak)}/device" if peak else None
  mfu_text = (f"MFU {100 * mfu:.1f}% of {per_device} ({source})" if mfu is not None and peak
              else f"MFU n/a ({f'peak {per_device}, ' if peak else ''}{source})")
  narrowed = cpus.narrowing_note(record["env"]["cpu_affinity"], record["env"]["cpu_count"],
                                 record["launcher"], record["env"]["cpu_binding"])
  return [
      f"{record['model']} ({record['num_params']:,} params) on {record['system']}: mesh "
      f"{record['mesh_shape']}, {record['num_devices']} device(s), {record['dtype']}, "
      f"batch {record['global_batch']}, {record['steps']} measured steps",
      f"{tokens} | {spread} | {mfu_text}",
      _startup_line(record),
      f"status {record['status']}, final loss {record['final_loss']} | record appended "
      f"to {path}:{line}",
  ] + ([narrowed] if narrowed else [])


def _startup_line(record: dict) -> str:
  """What came before the measured steps, as far as the run got."""
  def seconds(field):
    return None if record[field] is None else f"{record[field]:.1f}s"
  first = seconds("first_step_s")
  if first and record["compile_s"] is not None:
    first += f" (compile {seconds('compile_s')})"
  parts = [f"{label} {value}" for label, value in (
      ("build", seconds("build_s")), ("first step", first),
      ("warmup", seconds("warmup_s"))) if value]
  cache = record["compilation_cache"]
  return (f"startup: {', '.join(parts) or 'n/a'}"
          + (f" | compilation cache {cache}" if cache else ""))


def _check_writable_dir(path: str, flag: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK):
      raise PermissionError(13, "Permission denied")
  except OSError as e:
    raise UsageError(f"{flag}={path} is not a writable directory ({e.strerror}); "
                     "choose another") from None


def _check_strategy(experiment):
  """Checks the --strategy flags before any framework starts (the config's part in
  systems.check_strategy, which a suite's validation shares; the environment's part
  the system's runtime checks); the TPU's address or None."""
  strategy, system = FLAGS.strategy, systems.load(FLAGS.system)
  systems.check_strategy(FLAGS.system, strategy, experiment, FLAGS.num_cpu_devices)
  system.runtime.check(strategy, system.every_worker, FLAGS.cluster_timeout_s)
  tpu_flags = {"tpu": FLAGS.tpu, "tpu_zone": FLAGS.tpu_zone,
               "gcp_project": FLAGS.gcp_project}
  if FLAGS.tpu_type:
    from tf_tput.runtime import tpu
    tpu.kind_from_type(FLAGS.tpu_type)
    if strategy != "tpu" and not (strategy == "local" and system.runtime.finds_local_tpus):
      local = [name for name in systems.REGISTRY
               if systems.load(name).runtime.finds_local_tpus]
      raise UsageError(f"--tpu_type applies to TPUs: --strategy=tpu, or on a TPU host "
                       f"--system={' or --system='.join(local)}; not --system="
                       f"{FLAGS.system} --strategy={strategy}")
  if strategy != "tpu":
    given = [name for name, value in tpu_flags.items() if value]
    if given:
      raise UsageError(f"--{given[0]} applies to --strategy=tpu, not --strategy={strategy}")
    return None
  from tf_tput.runtime import tpu
  return tpu.address_from_flags(**tpu_flags)


def _check_islands(experiment) -> None:
  """Processes tf_tput.launch --islands put in islands train data parallel across them,
  or as a pipeline whose stages split across them (islands.check_mesh)."""
  num_islands = topology_lib.launched_islands()
  if not num_islands:
    return
  if not systems.load(FLAGS.system).islands:
    able = [name for name in systems.REGISTRY if systems.load(name).islands]
    raise UsageError(f"--system={FLAGS.system} does not train across islands; use "
                     f"--system={' or --system='.join(able)} under tf_tput.launch "
                     "--islands")
  islands.check_mesh(experiment, num_islands, systems.load(FLAGS.system).islands,
                     (FLAGS.num_cpu_devices or 0) * topology_lib.launched_processes()[0]
                     or None)


def _island_fields(experiment, outcome: Outcome, num_devices: int) -> dict:
  """The record's island fields: how many, their link's rate, and the bytes that
  crossed between them per measured step, counted and as the reduction predicts."""
  num_islands = topology_lib.launched_islands()  # 0: not under --islands
  timer = outcome.link_timer
  measured = timer.measured_change if timer is not None else None
  one = num_islands <= 1
  analytic = outcome.analytic_link_bytes
  if analytic is None and not one:
    analytic = islands.analytic_link_bytes(
        outcome.num_params * models.BYTES_PER_VARIABLE_ELEMENT, num_islands)
  return {
      "islands": num_islands, "devices_per_island": num_devices // max(1, num_islands),
      "dcn_rate": None if one else os.environ.get(islands.DCN_RATE_ENV),
      "link_bytes_per_step": (None if measured is None
                              else measured / experiment.train.steps),
      "link_bytes_per_step_analytic": None if one else analytic,
  }


def _trace_one_step(trainer, batches, run_id: str) -> None:
  """An extra, unmeasured step under the framework's trace; its summary goes to stdout."""
  path = os.path.join(FLAGS.trace_dir, f"{run_id}.trace.json")
  summary = trainer.trace_step(next(batches), path)
  print(summary + f"\nChrome trace: {path}", flush=True)


# The longest --cluster_timeout_s (11.6 days): every framework's clock takes it.
MAX_TIMEOUT_S = 1e6


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


def _user_cache() -> str:
  """The user's cache directory (XDG base directories: $XDG_CACHE_HOME, else
  ~/.cache)."""
  base = os.environ.get("XDG_CACHE_HOME", "")
  if not os.path.isabs(base):  # unset, or relative (which the spec says to ignore)
    base = os.path.join(os.path.expanduser("~"), ".cache")
  return base


def _peak_store(system, reprobe: bool) -> peak_store.PeakStore:
  """Where this CPU's probes for the system's framework are kept (--reprobe_peak)."""
  return peak_store.PeakStore(
      os.path.join(_user_cache(), "tf_tput", peak_store.FILE_NAME),
      provenance.versions(system.distributions), reprobe=reprobe)


def _compilation_cache_dir() -> Optional[str]:
  """The compilation cache's directory (None: off), created: a --compilation_cache_dir
  that is not writable is a usage error; the default one, a warning and no cache."""
  named = FLAGS.compilation_cache_dir
  if named is not None and named.strip().lower() in CACHE_OFF:
    return None
  if named is not None:
    _check_writable_dir(named, "--compilation_cache_dir")
    return named
  path = os.path.join(_user_cache(), CACHE_SUBDIR)
  try:
    _check_writable_dir(path, "--compilation_cache_dir")
  except UsageError as e:
    logging.warning("running without a compilation cache: %s", e)
    return None
  return path


def _checked_request():
  """Everything the flags and gin files ask for, checked before any framework starts:
  (experiment, TPU address or None, lines of --results that are not records, the
  compilation cache's directory or None)."""
  systems.check_name(FLAGS.system)
  experiment = _experiment()
  systems.check_experiment(FLAGS.system, experiment)
  num_processes, process_id = topology_lib.launched_processes()
  for name in ("num_cpu_devices", "log_every"):
    if FLAGS[name].value is not None and FLAGS[name].value < 1:
      raise UsageError(f"--{name}={FLAGS[name].value}; it must be >= 1")
  for name in ("cluster_timeout_s", "step_timeout_s"):
    timeout_s = FLAGS[name].value
    if timeout_s is not None and not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN too
      raise UsageError(f"--{name}={timeout_s}; it must be > 0 (seconds) and at most "
                       f"{MAX_TIMEOUT_S:g}")
  tpu_address = _check_strategy(experiment)
  _check_processes(systems.load(FLAGS.system))
  gemm.check(systems.load(FLAGS.system).runtime, FLAGS.strategy,
             experiment.model.activation_dtype, FLAGS.gemm)
  _check_islands(experiment)
  if FLAGS.num_cpu_devices is not None:
    config.validate(experiment, num_devices=FLAGS.num_cpu_devices * num_processes,
                    num_processes=num_processes)
  if _serves(systems.load(FLAGS.system)):  # a worker server: no record, no peak
    return experiment, tpu_address, [], None
  _check_host_memory(experiment)
  writes_record = process_id == 0
  malformed = results.check_appendable(FLAGS.results) if writes_record else []
  if FLAGS.tensorboard_dir and writes_record:
    _check_writable_dir(FLAGS.tensorboard_dir, "--tensorboard_dir")
  if FLAGS.trace_dir:
    if FLAGS.strategy not in systems.load(FLAGS.system).traces:
      able = [f"--system={name} --strategy={'|'.join(systems.load(name).traces)}"
              for name in systems.able("traces")]
      raise UsageError(f"--trace_dir: --system={FLAGS.system} --strategy={FLAGS.strategy}"
                       f" has no trace; tracing runs under {'; '.join(able)}")
    _check_writable_dir(FLAGS.trace_dir, "--trace_dir")
  for number, problem in malformed:
    logging.warning("%s:%d is not a record (%s); left untouched", FLAGS.results, number,
                    problem)
  cache_dir = (_compilation_cache_dir() if FLAGS.system in _cache_systems() else None)
  return experiment, tpu_address, malformed, cache_dir


def _drives_servers(system) -> bool:
  """Whether the system's one process drives worker servers (mtf
  --strategy=multi_worker): under a launcher of several processes (srun, a TF_CONFIG
  job) process 0 is that chief and the others serve it."""
  return FLAGS.strategy == "multi_worker" and systems.drives_worker_servers(system)


def _serves(system) -> bool:
  """Whether this process serves as a worker of the chief, process 0."""
  return _drives_servers(system) and topology_lib.launched_processes()[1] > 0


def _check_processes(system) -> None:
  """The processes their launcher started, against what the system runs as."""
  launch = topology_lib.launched()
  num_processes = launch.num_processes
  drives_servers = _drives_servers(system) and launch.launcher != "tf_tput.launch"
  if num_processes > 1 and not system.multi_process and not drives_servers:
    raise UsageError(f"--system={FLAGS.system} runs as one process (a single "
                     f"controller), not as {num_processes} processes of {launch.launcher}; "
                     "for a cluster use tf_tput.launch --num_workers=N -- ... "
                     "--strategy=multi_worker" + (
                         ", or srun with --strategy=multi_worker (task 0 drives the "
                         "others)" if systems.drives_worker_servers(system) else ""))
  if num_processes > 1 and system.every_worker and FLAGS.strategy != "multi_worker":
    raise UsageError(f"--system={FLAGS.system} runs as several processes only as the "
                     "workers of tf_tput.launch --num_workers=N with --strategy=multi_worker")


def _resolve_devices(system, experiment, tpu_address):
  """The run's Topology, checked against the mesh."""
  num_processes, _ = topology_lib.launched_processes()
  topology = system.runtime.resolve(FLAGS.num_cpu_devices, FLAGS.strategy,
                                    system.every_worker, FLAGS.cluster_timeout_s,
                                    tpu_address)
  config.validate(experiment, num_devices=topology.num_devices,
                  num_processes=num_processes)
  if FLAGS.tpu_type:
    if topology.platform != "tpu":
      raise UsageError(f"--tpu_type={FLAGS.tpu_type} names a TPU but this run's devices "
                       f"are {topology.platform} ({topology.device_kind}); drop the flag")
    from tf_tput.runtime import tpu
    # The kind the peak table reads, where the Cloud TPU API could not tell it.
    topology = dataclasses.replace(topology, device_kind=tpu.kind_from_type(FLAGS.tpu_type))
  return topology


def _train(system, experiment, topology, writes_record: bool, run_id: str,
           outcome: Outcome, startup_origin: float, guard: watchdog.Watchdog) -> Outcome:
  """Builds the batches and the trainer and runs the shared measured loop, filling
  `outcome` as it goes (its stage says how far it got); a build failure or a failed
  step is recorded in the measurement, not raised; anything else is raised, and run()
  records it under the stage. build_s runs from startup_origin (loop.CLOCK) to the
  built trainer. The loop fills outcome.measurement, which `guard` watches, and stops
  when a signal asks it to."""
  outcome.stage = "batches"
  batches = data.batches(experiment)  # built (synthetic) or prefetching (tfds) now
  writer = None
  t = experiment.train
  try:
    outcome.stage = "build"
    if FLAGS.tensorboard_dir and writes_record:
      from tf_tput.measure.tensorboard import ScalarWriter
      writer = ScalarWriter(FLAGS.tensorboard_dir)
    try:
      trainer = system.build(experiment, topology)
    except UsageError:
      raise
    except Exception as e:  # noqa: BLE001 - a build failure is still a recorded run
      logging.exception("building %s failed", system.name)
      outcome.measurement.error = f"build: {errors.cause(e)}"
      return outcome
    # A trainer that places its workers itself knows where they went; resolve could not.
    outcome.nodes = tuple(trainer.nodes or topology.nodes)
    build_s = loop.CLOCK() - startup_origin
    outcome.measurement.build_s = build_s  # kept should the loop itself raise
    outcome.stage = "train"
    links = os.environ.get(islands.LINKS_ENV)
    if links and writes_record:  # the links' counters, read around the measured steps
      outcome.link_timer = loop.ProbedTimer(lambda: islands.sent_over_links(links),
                                            t.warmup_steps, t.steps, t.sync_every)
    try:
      outcome.num_params = trainer.num_params
      outcome.analytic_link_bytes = trainer.analytic_link_bytes_per_step
      guard.watch(outcome.measurement)
      try:
        loop.run(trainer, batches, t.steps, t.warmup_steps, log_every=FLAGS.log_every,
                 on_step=writer.write if writer else None, sync_every=t.sync_every,
                 timer=outcome.link_timer, build_s=build_s,
                 should_stop=guard.should_stop, measurement=outcome.measurement)
      finally:
        guard.watch(None)  # what follows the loop is no window
      outcome.device_memory_bytes = trainer.device_memory_bytes()
      if FLAGS.trace_dir and not outcome.measurement.error and not guard.should_stop():
        outcome.stage = "trace"
        _trace_one_step(trainer, batches, run_id)
    finally:
      trainer.close()
  finally:
    if writer is not None:
      writer.close()
    if hasattr(batches, "close"):
      batches.close()  # a tfds prefetch thread
  return outcome


def _report(record: dict, malformed: list) -> int:
  """Appends the record, prints its summary; the exit code."""
  line = results.append(FLAGS.results, record)
  print("\n".join(_summary_lines(record, FLAGS.results, line)), flush=True)
  if record["error"]:
    print(f"error: run {record['status']}: {record['error']}", file=sys.stderr)
    return 1
  if malformed:
    lines = ", ".join(str(number) for number, _ in malformed)
    print(f"error: {FLAGS.results} line(s) {lines} are not records (left untouched; "
          f"this run's record is line {line}); remove or fix them", file=sys.stderr)
    return 1
  return 0


# peak_source of a run that failed before its peak was probed.
UNPROBED = "none: the run failed before the peak probe"


def _unresolved(system, experiment) -> topology_lib.Topology:
  """The devices the request asks for, as the record names them until they resolve;
  a run that fails before then keeps them."""
  return topology_lib.Topology(
      system.runtime.name, "unresolved",
      tuple(f"unresolved:{i}" for i in range(experiment.num_devices)),
      "not resolved: the run failed first",
      num_processes=topology_lib.launched_processes()[0], strategy=FLAGS.strategy)


def _failed(outcome: Outcome, error: str) -> None:
  """Records a failure after any the measurement holds already."""
  m = outcome.measurement
  m.error = f"{m.error}; then {error}" if m.error else error


def _cache_state(system, cache_dir: Optional[str]) -> Optional[str]:
  """The record's compilation_cache: whether every compilation of the run so far came
  from the runtime's cache (docs/records.md)."""
  if not system.runtime.keeps_compilation_cache:
    return None
  if cache_dir is None:
    return "off"
  return {True: "hit", False: "miss", None: None}[system.runtime.compilation_cache_hit()]


def run() -> int:
  # Startup's origin (docs/measurement.md, "Startup"): everything from here to the
  # built trainer but the peak probe is build_s.
  run_started = loop.CLOCK()
  if FLAGS.keep_freed_memory:  # before any framework allocates
    host_memory.keep_freed_memory()
  experiment, tpu_address, malformed, cache_dir = _checked_request()
  system = systems.load(FLAGS.system)
  if _serves(system):
    logging.info("process %d of %s serves the chief", topology_lib.launched_processes()[1],
                 topology_lib.launched().launcher)
    return system.runtime.serve_worker(FLAGS.cluster_timeout_s)
  run_key = _run_key()
  process_id = topology_lib.launched_processes()[1]
  writes_record = process_id == 0  # process 0 speaks for all
  # One id for all the run's processes where their launcher gives one (each logs it).
  started_at = build.utc_now()
  run_id = topology_lib.launched().run_id or build.new_run_id()
  live = host_runs.LiveRun(run_id)  # registered by the writer once the run starts
  t = experiment.train

  def new_outcome(error=None) -> Outcome:
    return Outcome(loop.Measurement(warmup_steps=t.warmup_steps, sync_every=t.sync_every,
                                    error=error), models.num_params(experiment.model))

  def record(topology, outcome, peak, peak_source) -> dict:
    summary = metrics.summarize(outcome.measurement, experiment, topology.num_devices,
                                peak)
    return _record(experiment, topology, outcome, summary, peak_source, started_at,
                   run_id, run_key, live.others())

  # Every value the record will hold, checked before any framework starts: a failed
  # record of this request, nothing run yet.
  topology, peak, peak_source = _unresolved(system, experiment), None, UNPROBED
  try:
    results.validate(build.plain(record(topology, new_outcome("not run"), peak, peak_source)))
  except ValueError as e:
    raise UsageError(f"this run's record would not be valid ({e}); fix the bindings or "
                     "flags it names") from None
  # From here on every ending is a record (process 0's): ok, failed, or interrupted by
  # a signal; a hung step is failed (runtime/watchdog.py).
  outcome = new_outcome()

  def finish(ending: Optional[watchdog.Ending], from_thread: bool = False) -> int:
    """Process 0 appends the record; the exit code. from_thread: the watchdog's
    thread ends the run, the main thread still running: a snapshot of its outcome."""
    done = outcome
    if from_thread:
      done = dataclasses.replace(outcome, measurement=outcome.measurement.snapshot())
    done.ending = ending
    done.compilation_cache = _cache_state(system, cache_dir)
    if not writes_record:
      return ending.exit_code if ending else (1 if done.measurement.error else 0)
    return _write(done, lambda o, *rest: record(topology, o, *rest), peak, peak_source,
                  new_outcome, run_id, malformed)

  guard = watchdog.Watchdog(finish, FLAGS.step_timeout_s, process_id, progress=lambda: (
      outcome.measurement.snapshot(), outcome.stage)).install()
  try:
    if writes_record:
      live.register()
    try:
      if system.runtime.keeps_compilation_cache:  # before anything compiles
        system.runtime.compilation_cache(cache_dir)
      # Before the framework loads: a path is the environment it loads under. Only
      # process 0 reprobes; the others read what it kept (the store's lock orders them).
      outcome.stage = "GEMM path probe"
      gemm_started = loop.CLOCK()
      store = _peak_store(system, FLAGS.reprobe_peak and writes_record)
      outcome.gemm = gemm.choose(FLAGS.system, system.runtime, FLAGS.strategy,
                                 experiment.model.activation_dtype, store, FLAGS.gemm)
      store = store.for_gemm(outcome.gemm and outcome.gemm["path"])
      gemm_s = loop.CLOCK() - gemm_started  # the harness's probes: not startup
      outcome.stage = "devices"
      topology = _resolve_devices(system, experiment, tpu_address)
      guard.take_signals()  # back from jax.distributed's preemption notifier
      logging.info("run %s: %s on %s, %d %s device(s) in %d process(es)", run_id,
                   experiment.model.name, system.name, topology.num_devices,
                   topology.platform, topology.num_processes)
      # Only the writer measures the peak, the others waiting: they share this host's
      # cores.
      outcome.stage = "peak probe"
      probe_started = loop.CLOCK()
      peak, peak_source = peak_lib.probe_alone(system.runtime, topology,
                                               experiment.model.activation_dtype,
                                               probes=writes_record, store=store)
      probe_s = loop.CLOCK() - probe_started  # the harness's matmul: not startup
      _train(system, experiment, topology, writes_record, run_id, outcome,
             startup_origin=run_started + gemm_s + probe_s, guard=guard)
      if writes_record and not outcome.measurement.error and not guard.should_stop():
        outcome.stage = "peak probe after the run"  # a failed run's goes as it is
        peak, peak_source = peak_lib.reprobed(system.runtime, topology,
                                              experiment.model.activation_dtype,
                                              (peak, peak_source), store)
    except Exception as e:  # noqa: BLE001 - a failure after the check is a recorded run
      # A usage error or a timeout says all in its message; anything else gets its stack.
      logging.error("the run failed in its %s: %s", outcome.stage, errors.cause(e),
                    exc_info=not isinstance(e, (UsageError, TimeoutError)))
      _failed(outcome, f"{outcome.stage}: {errors.cause(e)}")
    guard.watch(None)
    ending = None
    if guard.signum is not None:
      ending = guard.signal_ending(outcome.measurement, outcome.stage)
    if not guard.claim():
      guard.wait_for_the_thread()
    return finish(ending)
  finally:
    guard.close()
    live.close()


def _write(outcome: Outcome, record, peak, peak_source, new_outcome, run_id: str,
           malformed: list) -> int:
  """Appends the run's record and prints its summary; the exit code. record(outcome,
  peak, peak_source) builds it; where it cannot be, a record of the failure alone."""
  try:
    try:
      final = build.valid_record(record(outcome, peak, peak_source))
    except Exception as e:  # noqa: BLE001 - the measurement must still reach a record
      logging.exception("building the record failed")
      _failed(outcome, f"record: {errors.cause(e)}")
      bare = new_outcome(outcome.measurement.error)
      bare.ending = outcome.ending
      final = build.valid_record(record(bare, None, UNPROBED))
  except Exception as e:  # noqa: BLE001 - no record can be made; say so, in one line
    logging.exception("the record of run %s cannot be made", run_id)
    print(f"error: run {run_id} ended ({_status(outcome)[1] or 'ok'}) but its record "
          f"cannot be made ({errors.cause(e)}); nothing was appended to --results="
          f"{FLAGS.results}", file=sys.stderr)
    return outcome.ending.exit_code if outcome.ending else 1
  try:
    code = _report(final, malformed)
  except OSError as e:  # the append itself, undone: the record goes elsewhere
    print(f"error: the record of run {run_id} (status {final['status']}) could not be "
          f"appended to --results={FLAGS.results} ({errors.cause(e)}), which is left as "
          f"it was; the record is in {results.keep_aside(final)}", file=sys.stderr)
    code = 1
  return outcome.ending.exit_code if outcome.ending else code


def main(argv) -> int:
  return errors.run_entry_point(run, argv)


if __name__ == "__main__":
  entry.start(main)
