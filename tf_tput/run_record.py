"""One run's outcome and its record: what training and measuring produced (Outcome),
the record built from it (record), and the summary lines printed beside it."""

import dataclasses
import os
from typing import Optional

from tf_tput import models, pipeline, preflight, reduction, systems
from tf_tput.measure import loop, peak as peak_lib
from tf_tput.records import build, keys, results
from tf_tput.request import Request
from tf_tput.runtime import cpus, islands, topology as topology_lib, watchdog


@dataclasses.dataclass
class Outcome:
  """What training and measuring produced, whether or not the run succeeded."""
  measurement: loop.Measurement
  num_params: int
  device_memory_bytes: Optional[int] = None
  link_timer: Optional[loop.ProbedTimer] = None  # across islands: bytes between them
  # Bytes a step sends between islands by the trainer's own account (mtf counts what
  # its lowering all-reduces or sends; pipelines count stage boundaries); None: one
  # gradient per parameter, reduced hierarchically (reduction.analytic_link_bytes).
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


def status_of(outcome: Outcome) -> tuple:
  """The record's (status, error): an ending's, a failure seen after it appended."""
  error, ending = outcome.measurement.error, outcome.ending
  if ending is None:
    return ("failed" if error else "ok"), error
  return ending.status, ending.error + (f"; then {error}" if error else "")


# peak_source of a run that failed before its peak was probed.
UNPROBED = "none: the run failed before the peak probe"


def run_key(request: Request) -> str:
  """The suite's key for this command line (tf_tput.records.keys), taken before the run
  starts: gin files or code edited while it runs must not lend it their key."""
  num_processes, _ = topology_lib.launched_processes()
  if preflight.drives_servers(request, systems.load(request.system)):
    num_processes = 1  # the chief, as under tf_tput.launch --num_workers
  launch = keys.launch_fields(num_processes, topology_lib.launched_islands(),
                              os.environ.get(islands.DCN_RATE_ENV, islands.NO_LIMIT))
  return keys.run_key(request.system, list(request.gin_file), request.bindings(),
                      request.num_cpu_devices, request.strategy, keys.code_version(),
                      launch)


def record(request: Request, experiment, topology, outcome: Outcome, summary,
           peak_source, started_at, run_id, run_key: str, concurrent_runs: list) -> dict:
  m, d, t = experiment.model, experiment.data, experiment.train
  measurement = outcome.measurement
  losses = measurement.losses
  status, error = status_of(outcome)
  return build.record(results.SCHEMA, {
      "system": request.system,
      "strategy": topology.strategy,
      "model": m.name, "arch": m.arch,
      "num_params": outcome.num_params, "mesh_shape": experiment.mesh.mesh_shape,
      "layout": experiment.mesh.layout, "num_devices": topology.num_devices,
      "num_processes": topology.num_processes,
      **_launch_fields(),
      "concurrent_runs": concurrent_runs, "packed": request.packed,
      **build.node_fields(outcome.nodes or topology.nodes),  # the trainer's, else resolve's
      "global_batch": t.global_batch,
      "inputs_length": d.inputs_length if m.arch == "encoder_decoder" else None,
      "targets_length": d.targets_length, "dtype": m.activation_dtype,
      "embedding": m.embedding, "variant": systems.variant(request.system, experiment),
      "caveat": systems.caveat(request.system), **pipeline.record_fields(experiment),
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
      "flags": request.as_flags(),
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


def _island_fields(experiment, outcome: Outcome, num_devices: int) -> dict:
  """The record's island fields: how many, their link's rate, and the bytes that
  crossed between them per measured step, counted and as the reduction predicts."""
  num_islands = topology_lib.launched_islands()  # 0: not under --islands
  timer = outcome.link_timer
  measured = timer.measured_change if timer is not None else None
  one = num_islands <= 1
  analytic = outcome.analytic_link_bytes
  if analytic is None and not one:
    analytic = reduction.analytic_link_bytes(
        outcome.num_params * models.BYTES_PER_VARIABLE_ELEMENT, num_islands)
  return {
      "islands": num_islands, "devices_per_island": num_devices // max(1, num_islands),
      "dcn_rate": None if one else os.environ.get(islands.DCN_RATE_ENV),
      "link_bytes_per_step": (None if measured is None
                              else measured / experiment.train.steps),
      "link_bytes_per_step_analytic": None if one else analytic,
  }


def summary_lines(record: dict, path: str, line: int) -> list:
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
