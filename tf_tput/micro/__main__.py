r"""Dispatch micro-benchmarks (Pathways Fig. 5 / 6) -> micro records and a table.

    python -m tf_tput.micro --systems=tf,jax,ray --modes=opbyop,chained,fused \
        --hosts=1,2,4 --devices_per_host=2 --results=results/micro.jsonl [--crossover]

Every host is a local process on loopback (a tf.distribute.Server, a jax.distributed
process, a Ray actor); see tf_tput/micro/__init__.py for the computation and modes.
A system whose extra is not installed is recorded as skipped, a mode a system does
not have as not applicable, a failed run as failed; the others still run.

TF's servers listen on every interface, so each tf run goes inside a private network
namespace with nothing but loopback, its client with it (tf_single.run_private; needs
root and iproute2); one client process there serves every tf run of the invocation.
Where none can be made, --systems with tf is refused in one line unless
--expose_servers accepts servers reachable from other machines.
"""

import dataclasses
import sys

from absl import flags
from absl import logging

from tf_tput import micro, systems
from tf_tput.micro import sizing
from tf_tput.records import build, keys, provenance, results
from tf_tput import entry, errors
from tf_tput.errors import UsageError
from tf_tput.runtime import namespaces

FLAGS = flags.FLAGS
flags.DEFINE_list("systems", ["tf", "jax", "ray"], f"Systems: {', '.join(micro.SYSTEMS)}.")
flags.DEFINE_list("modes", list(micro.MODES), f"Modes: {', '.join(micro.MODES)}.")
flags.DEFINE_list("hosts", ["1", "2", "4"], "Host counts (each host a local process).")
flags.DEFINE_integer("devices_per_host", 2, "Devices per host (virtual CPU devices).")
flags.DEFINE_integer("chain_length", 128, "Computations per chained / fused call.")
flags.DEFINE_integer("computations", 1024, "Computations per timed repeat (a multiple "
                     "of --chain_length).")
flags.DEFINE_integer("repeats", 5, "Timed repeats (after one untimed warmup repeat).")
flags.DEFINE_float("timeout_s", 600, "Limit for one system x mode x hosts run, its "
                   "hosts' start-up and every wait for them to connect included.")
flags.DEFINE_string("results", "results/micro.jsonl", "JSON-lines file for the records.")
flags.DEFINE_bool("crossover", False, "Fig. 6: also find, per host count, the smallest "
                  "computation at which each single-controller system reaches "
                  "--crossover_fraction of JAX's computations/s (opbyop). Slow: a run "
                  "per system and --crossover_ms duration, per host count (8.5 min at "
                  "--hosts=1 on a 2-core EPYC; docs/micro.md).")
flags.DEFINE_list("crossover_ms", ["0.1", "0.3", "1", "3", "10", "30"], "Computation "
                  "durations (ms of one n x n float32 matmul) tried by --crossover.")
flags.DEFINE_float("crossover_fraction", 0.95, "Fraction of JAX's rate to reach.")
flags.DEFINE_float("crossover_repeat_s", 1.0, "Target seconds per timed repeat there.")
flags.DEFINE_bool("bare_loop", True, "With jax opbyop on 1 host, also time a bare loop "
                  "of the same jitted call and print the harness / bare ratio.")
flags.DEFINE_bool("expose_servers", False, "tf: run its servers and their client in this "
                  "machine's own network, where the servers listen on every interface, "
                  "reachable (unauthenticated) from any machine that reaches this one. "
                  "Unset: inside a private network namespace with nothing but loopback "
                  "(needs root and iproute2).")


@dataclasses.dataclass(frozen=True)
class MicroRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  systems: tuple
  modes: tuple
  hosts: tuple
  devices_per_host: int
  chain_length: int
  computations: int
  repeats: int
  timeout_s: float
  results: str
  crossover: bool
  crossover_ms: tuple
  crossover_fraction: float
  crossover_repeat_s: float
  bare_loop: bool
  expose_servers: bool


def _record(spec: micro.Spec, status: str, error=None, seconds=(), computation_ms=None,
            computation_ms_measured=None):
  rates = [spec.computations / s for s in seconds]
  wall = sum(seconds) if seconds else None
  return build.record(results.MICRO_SCHEMA, {
      "system": spec.system, "mode": spec.mode,
      "hosts": spec.hosts, "devices_per_host": spec.devices_per_host,
      "chain_length": spec.chain_length, "computations": spec.computations,
      "matmul_n": spec.matmul_n, "computation_ms": computation_ms,
      "computation_ms_measured": computation_ms_measured, "wall_s": wall,
      "computations_per_sec": spec.computations * len(seconds) / wall if wall else None,
      "repeats": rates,
      "run_key": keys.micro_run_key(spec.system, spec.mode, spec.hosts,
                                    spec.devices_per_host, spec.chain_length,
                                    spec.computations, spec.matmul_n, keys.code_version()),
  }, [{"platform": "cpu", "kind": provenance.cpu_model(), "count": spec.num_devices}],
      systems.distributions(), status=status, error=error)


# run_ids of records that could not be appended (kept aside instead): exit 1.
NOT_APPENDED = []


def measure(request: MicroRequest, spec: micro.Spec, computation_ms=None,
            computation_ms_measured=None) -> dict:
  """One system x mode x hosts run -> its record (appended to --results)."""
  sized = dict(computation_ms=computation_ms,
               computation_ms_measured=computation_ms_measured)
  module = micro.system_module(spec.system)
  reason = module.unavailable()
  if reason:
    record = _record(spec, "skipped", reason)
  elif spec.mode not in module.MODES:
    record = _record(spec, "not_applicable",
                     f"{spec.system} has no {spec.mode} mode (as in the paper)")
  else:
    logging.info("%s %s, %d host(s) x %d devices%s", spec.system, spec.mode, spec.hosts,
                 spec.devices_per_host, f", matmul {spec.matmul_n}" if spec.matmul_n else "")
    try:
      runner = _runner(module, request.expose_servers)
      record = _record(spec, "ok", seconds=runner(spec), **sized)
    except (KeyboardInterrupt, SystemExit):
      raise
    except Exception as e:  # noqa: BLE001 - one failed run is recorded, others go on
      logging.exception("%s %s failed", spec.system, spec.mode)
      record = _record(spec, "failed", errors.cause(e), **sized)
  try:
    results.append(request.results, record)
  except OSError as e:  # the append, undone: the record goes elsewhere
    NOT_APPENDED.append(record["run_id"])
    print(f"error: the record of {spec.system} {spec.mode}, {spec.hosts} host(s) could "
          f"not be appended to --results={request.results} ({errors.cause(e)}), which is "
          f"left as it was; the record is in {results.keep_aside(record)}",
          file=sys.stderr)
  return record


def _runner(module, expose_servers: bool):
  """module.run, or where the system's servers listen on every interface (tf, whose
  module's run_private is not None) its run inside a private network namespace,
  unless --expose_servers."""
  private = module.run_private
  return module.run if expose_servers or private is None else private


def _check_private_network(request: MicroRequest) -> None:
  """UsageError naming --expose_servers where a system of --systems needs a private
  network namespace and none can be made here: refused before anything runs."""
  if request.expose_servers:
    return
  needing = [s for s in request.systems if micro.system_module(s).run_private is not None]
  problem = namespaces.private_missing() if needing else None
  if problem:
    raise UsageError(f"--systems={','.join(needing)}: its servers listen on every "
                     "interface, so they run inside a private network namespace with "
                     f"only loopback, but {problem}; run as root with iproute2, or pass "
                     "--expose_servers to run them in this machine's network, reachable "
                     "(unauthenticated) from other machines")


def _bare_loop_ratio(spec: micro.Spec, harness_rate: float) -> str:
  from tf_tput.micro import jax_multi
  seconds = jax_multi.run(spec, bare=True)
  bare_rate = spec.computations * len(seconds) / sum(seconds)
  return (f"jax opbyop, 1 host: harness {harness_rate:,.0f} vs bare loop "
          f"{bare_rate:,.0f} computations/s ({100 * harness_rate / bare_rate:.0f}%)")


def crossover(request: MicroRequest, hosts_list, durations: list, base: dict) -> list:
  """Fig. 6 lines: per single-controller system and host count, the smallest tried
  duration whose opbyop rate reaches the fraction of JAX's. Every matmul size comes
  from one rate calibrated here, once (tf_tput/micro/sizing.py)."""
  rate = sizing.matmul_rate()
  sizes = sizing.sizes(durations, rate)
  measured = {ms: sizing.measured_ms(n) for ms, n in sizes.items()}

  def sized(ms):
    return f"{ms:g} ms (n={sizes[ms]}, measured here {measured[ms]:.3g} ms)"

  lines = [f"matmul sizing: numpy float32 {rate / 1e9:,.1f} GFLOP/s (best of "
           f"{sizing.CALIBRATION_RUNS} runs of >= {sizing.CALIBRATION_MIN_S * 1e3:g} ms): "
           + ", ".join(map(sized, durations))]
  for hosts in hosts_list:
    records = {}
    for ms in durations:
      computations = max(8, round(request.crossover_repeat_s * 1e3 / ms))
      for system in request.systems:
        spec = micro.Spec(system, "opbyop", hosts, matmul_n=sizes[ms],
                          computations=computations, chain_length=1, repeats=3, **base)
        records[(system, ms)] = measure(request, spec, ms, measured[ms])
    for system in (s for s in request.systems if s != micro.REFERENCE):
      lines.append(f"crossover {system} vs {micro.REFERENCE}, {hosts} host(s): "
                   + micro.crossover_result(system, durations, records,
                                            request.crossover_fraction, sized))
  return lines


def format_table(records: list) -> str:
  rows = [("system", "mode", "hosts", "devices", "computations/s", "repeats min-max",
           "status")]
  for r in records:
    rate = r["computations_per_sec"]
    spread = (f"{min(r['repeats']):,.0f}-{max(r['repeats']):,.0f}" if r["repeats"] else "-")
    rows.append((r["system"], r["mode"], str(r["hosts"]),
                 str(r["hosts"] * r["devices_per_host"]),
                 f"{rate:,.0f}" if rate else "-", spread,
                 r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error'][:70]}"))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                   for row in rows)


def _validated_args(request: MicroRequest):
  unknown = [s for s in request.systems if s not in micro.SYSTEMS]
  if unknown:
    raise UsageError(f"--systems: unknown {unknown}; choose from {sorted(micro.SYSTEMS)}")
  bad_modes = [m for m in request.modes if m not in micro.MODES]
  if bad_modes:
    raise UsageError(f"--modes: unknown {bad_modes}; choose from {list(micro.MODES)}")
  try:
    hosts = [int(h) for h in request.hosts]
  except ValueError:
    raise UsageError(f"--hosts={','.join(request.hosts)}: host counts are integers, "
                     "e.g. --hosts=1,2,4") from None
  for name, value in (("--devices_per_host", request.devices_per_host),
                      ("--chain_length", request.chain_length),
                      ("--computations", request.computations),
                      ("--repeats", request.repeats),
                      *((f"--hosts={h}", h) for h in hosts)):
    if value < 1:
      raise UsageError(f"{name} is {value}; it must be >= 1")
  if not 0 < request.timeout_s <= 1e6:  # NaN too
    raise UsageError(f"--timeout_s={request.timeout_s}; it must be > 0 (seconds) and at "
                     "most 1e6")
  if request.crossover and micro.REFERENCE not in request.systems:
    raise UsageError(f"--crossover compares each system's rate with {micro.REFERENCE}'s, "
                     f"but --systems={','.join(request.systems)} has no {micro.REFERENCE}; "
                     f"add it, e.g. --systems={','.join([*request.systems, micro.REFERENCE])}")
  if request.computations % request.chain_length:
    raise UsageError(f"--computations={request.computations} is not a multiple of "
                     f"--chain_length={request.chain_length}; e.g. --computations="
                     f"{request.chain_length * 8}")
  return hosts, _crossover_ms(request.crossover_ms)


def _crossover_ms(asked) -> list:
  try:
    durations = [float(ms) for ms in asked]
  except ValueError:
    durations = []
  if not durations or not all(ms > 0 for ms in durations):
    raise UsageError(f"--crossover_ms={','.join(asked)}: durations are "
                     "positive milliseconds, e.g. --crossover_ms=0.3,3")
  return sorted(durations)


def run(request: MicroRequest) -> int:
  try:
    hosts_list, durations = _validated_args(request)
    _check_private_network(request)
    malformed = results.check_appendable(request.results)
    keys.code_version()  # taken now: code edited while the runs go must not lend its key
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  for number, problem in malformed:
    logging.warning("%s:%d is not a record (%s); left untouched", request.results, number,
                    problem)
  base = dict(devices_per_host=request.devices_per_host, timeout_s=request.timeout_s)
  records, notes = [], []
  try:
    for hosts in hosts_list:
      for system in request.systems:
        for mode in request.modes:
          spec = micro.Spec(system, mode, hosts, chain_length=request.chain_length,
                            computations=request.computations, repeats=request.repeats,
                            **base)
          records.append(measure(request, spec))
          last = records[-1]
          if (request.bare_loop and system == "jax" and mode == "opbyop" and hosts == 1
              and last["status"] == "ok"):
            notes.append(_bare_loop_ratio(spec, last["computations_per_sec"]))
    if request.crossover:
      notes += crossover(request, hosts_list, durations, base)
  except KeyboardInterrupt:
    print(f"error: interrupted; {len(records)} records kept in {request.results}",
          file=sys.stderr)
    return 130
  finally:
    for system in request.systems:  # what a system kept from one run to the next
      micro.system_module(system).close()
  print(format_table(records))
  print("\n".join(notes))
  print(f"records: {request.results}")
  return 1 if NOT_APPENDED or any(r["status"] == "failed" for r in records) else 0


def main(argv) -> int:
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  return run(MicroRequest(
      systems=tuple(FLAGS.systems), modes=tuple(FLAGS.modes), hosts=tuple(FLAGS.hosts),
      devices_per_host=FLAGS.devices_per_host, chain_length=FLAGS.chain_length,
      computations=FLAGS.computations, repeats=FLAGS.repeats, timeout_s=FLAGS.timeout_s,
      results=FLAGS.results, crossover=FLAGS.crossover,
      crossover_ms=tuple(FLAGS.crossover_ms), crossover_fraction=FLAGS.crossover_fraction,
      crossover_repeat_s=FLAGS.crossover_repeat_s, bare_loop=FLAGS.bare_loop,
      expose_servers=FLAGS.expose_servers))


if __name__ == "__main__":
  entry.start(main)
