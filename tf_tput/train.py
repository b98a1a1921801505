r"""One training-throughput run -> one result record.

    python -m tf_tput.train --gin_file=gin/models/t5_small.gin \
        --gin_file=gin/mesh/data2_model2.gin --system=mtf --num_cpu_devices=4 \
        --steps=20 --results=results/runs.jsonl

Everything that can be wrong with the request is checked before any framework
starts; a run that fails after that still appends a record with status "failed".
"""

import dataclasses
import functools
import os
import sys
from typing import Optional

from absl import flags
from absl import logging

from tf_tput import config, data, entry, errors, models, preflight, run_record, systems
from tf_tput import gemm_probe, request as request_lib
from tf_tput.errors import UsageError
from tf_tput.measure import gemm, loop, metrics, peak as peak_lib, peak_store
from tf_tput.records import build, provenance, results
from tf_tput.request import Request
from tf_tput.run_record import Outcome
from tf_tput.runtime import host_memory, host_runs, islands, topology as topology_lib
from tf_tput.runtime import watchdog

# The flags (tf_tput/request.py) are read only in main(), into one Request; run(request)
# is the run core, which a program or a test may call as well; preflight.py checks the
# request before any framework starts, run_record.py builds the record.
FLAGS = flags.FLAGS
request_lib.define_flags(__name__)  # this module's: its --helpshort lists them


def _peak_store(system, reprobe: bool) -> peak_store.PeakStore:
  """Where this CPU's probes for the system's framework are kept (--reprobe_peak):
  under the versions of its runtime's framework, so systems on one framework (mtf,
  tf2) share them."""
  return peak_store.PeakStore(
      os.path.join(preflight.user_cache(), "tf_tput", peak_store.FILE_NAME),
      provenance.versions(systems.probe_distributions(system)),
      reprobe=reprobe)


def _resolve_devices(request: Request, system, experiment, tpu_address):
  """The run's Topology, checked against the mesh."""
  num_processes, _ = topology_lib.launched_processes()
  topology = system.runtime.resolve(request.num_cpu_devices, request.strategy,
                                    system.every_worker, request.cluster_timeout_s,
                                    tpu_address)
  config.validate(experiment, num_devices=topology.num_devices,
                  num_processes=num_processes)
  if request.tpu_type:
    if topology.platform != "tpu":
      raise UsageError(f"--tpu_type={request.tpu_type} names a TPU but this run's "
                       f"devices are {topology.platform} ({topology.device_kind}); drop "
                       "the flag")
    from tf_tput.runtime import tpu
    # The kind the peak table reads, where the Cloud TPU API could not tell it.
    topology = dataclasses.replace(topology,
                                   device_kind=tpu.kind_from_type(request.tpu_type))
  return topology


def _train(request: Request, system, experiment, topology, writes_record: bool,
           run_id: str, outcome: Outcome, startup_origin: float,
           guard: watchdog.Watchdog) -> Outcome:
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
    if request.tensorboard_dir and writes_record:
      from tf_tput.measure.tensorboard import ScalarWriter
      writer = ScalarWriter(request.tensorboard_dir)
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
        loop.run(trainer, batches, t.steps, t.warmup_steps, log_every=request.log_every,
                 on_step=writer.write if writer else None, sync_every=t.sync_every,
                 timer=outcome.link_timer, build_s=build_s,
                 should_stop=guard.should_stop, measurement=outcome.measurement)
      finally:
        guard.watch(None)  # what follows the loop is no window
      outcome.device_memory_bytes = trainer.device_memory_bytes()
      if request.trace_dir and not outcome.measurement.error and not guard.should_stop():
        outcome.stage = "trace"
        _trace_one_step(trainer, batches, request.trace_dir, run_id)
    finally:
      trainer.close()
  finally:
    if writer is not None:
      writer.close()
    batches.close()  # a tfds prefetch thread; synthetic batches have nothing to stop
  return outcome


def _trace_one_step(trainer, batches, trace_dir: str, run_id: str) -> None:
  """An extra, unmeasured step under the framework's trace; its summary goes to stdout."""
  path = os.path.join(trace_dir, f"{run_id}.trace.json")
  summary = trainer.trace_step(next(batches), path)
  print(summary + f"\nChrome trace: {path}", flush=True)


def _report(results_path: str, record: dict, malformed: list) -> int:
  """Appends the record, prints its summary; the exit code."""
  line = results.append(results_path, record)
  print("\n".join(run_record.summary_lines(record, results_path, line)), flush=True)
  if record["error"]:
    print(f"error: run {record['status']}: {record['error']}", file=sys.stderr)
    return 1
  if malformed:
    lines = ", ".join(str(number) for number, _ in malformed)
    print(f"error: {results_path} line(s) {lines} are not records (left untouched; "
          f"this run's record is line {line}); remove or fix them", file=sys.stderr)
    return 1
  return 0


def _unresolved(system, experiment, strategy: str) -> topology_lib.Topology:
  """The devices the request asks for, as the record names them until they resolve;
  a run that fails before then keeps them."""
  return topology_lib.Topology(
      system.runtime.name, "unresolved",
      tuple(f"unresolved:{i}" for i in range(experiment.num_devices)),
      "not resolved: the run failed first",
      num_processes=topology_lib.launched_processes()[0], strategy=strategy)


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


def run(request: Request) -> int:
  """Runs what the request asks for: one record (process 0's), or, for a worker that
  serves a chief, none; the exit code."""
  # Startup's origin (docs/measurement.md, "Startup"): everything from here to the
  # built trainer but the peak probe is build_s.
  run_started = loop.CLOCK()
  if request.keep_freed_memory:  # before any framework allocates
    host_memory.keep_freed_memory()
  checked = preflight.check(request)
  experiment, tpu_address, malformed, cache_dir = (
      checked.experiment, checked.tpu_address, checked.malformed, checked.cache_dir)
  system = systems.load(request.system)
  if preflight.serves(request, system):
    logging.info("process %d of %s serves the chief", topology_lib.launched_processes()[1],
                 topology_lib.launched().launcher)
    return system.runtime.serve_worker(request.cluster_timeout_s)
  key = run_record.run_key(request)
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
    return run_record.record(request, experiment, topology, outcome, summary,
                             peak_source, started_at, run_id, key, live.others())

  # Every value the record will hold, checked before any framework starts: a failed
  # record of this request, nothing run yet.
  topology = _unresolved(system, experiment, request.strategy)
  peak, peak_source = None, run_record.UNPROBED
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
                  new_outcome, run_id, request.results, malformed)

  # The run's lifecycle: its place among the host's live runs and its watchdog (signals,
  # hung steps) from here to its ending, which guard.end writes once, here or from the
  # watchdog's thread.
  with live, watchdog.Watchdog(finish, request.step_timeout_s, process_id,
                               progress=lambda: (outcome.measurement.snapshot(),
                                                 outcome.stage)) as guard:
    if writes_record:
      live.register()
    try:
      if system.runtime.keeps_compilation_cache:  # before anything compiles
        system.runtime.compilation_cache(cache_dir)
      # Before the framework loads: a path is the environment it loads under. Only
      # process 0 reprobes; the others read what it kept (the store's lock orders them).
      outcome.stage = "GEMM path probe"
      gemm_started = loop.CLOCK()
      store = _peak_store(system, request.reprobe_peak and writes_record)
      outcome.gemm = gemm.choose(
          system.runtime, request.strategy, experiment.model.activation_dtype, store,
          functools.partial(gemm_probe.probe_in_child, request.system), request.gemm)
      store = store.for_gemm(outcome.gemm and outcome.gemm["path"])
      gemm_s = loop.CLOCK() - gemm_started  # the harness's probes: not startup
      outcome.stage = "devices"
      topology = _resolve_devices(request, system, experiment, tpu_address)
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
      _train(request, system, experiment, topology, writes_record, run_id, outcome,
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
    return guard.end(outcome.measurement, outcome.stage)


def _write(outcome: Outcome, record, peak, peak_source, new_outcome, run_id: str,
           results_path: str, malformed: list) -> int:
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
      final = build.valid_record(record(bare, None, run_record.UNPROBED))
  except Exception as e:  # noqa: BLE001 - no record can be made; say so, in one line
    logging.exception("the record of run %s cannot be made", run_id)
    print(f"error: run {run_id} ended ({run_record.status_of(outcome)[1] or 'ok'}) but "
          f"its record cannot be made ({errors.cause(e)}); nothing was appended to "
          f"--results={results_path}", file=sys.stderr)
    return outcome.ending.exit_code if outcome.ending else 1
  try:
    code = _report(results_path, final, malformed)
  except OSError as e:  # the append itself, undone: the record goes elsewhere
    print(f"error: the record of run {run_id} (status {final['status']}) could not be "
          f"appended to --results={results_path} ({errors.cause(e)}), which is left as "
          f"it was; the record is in {results.keep_aside(final)}", file=sys.stderr)
    code = 1
  return outcome.ending.exit_code if outcome.ending else code


def main(argv) -> int:
  return errors.run_entry_point(lambda: run(request_lib.from_flags(FLAGS)), argv)


if __name__ == "__main__":
  entry.start(main)
