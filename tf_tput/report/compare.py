"""--compare: the configurations two result files share, and whether each one's
throughput changed by more than its run-to-run noise.

One run's step-to-step spread does not bound the next run: on a shared 2-core VM,
runs of one configuration move by up to +-30% between runs, and two identical
back-to-back runs of decoder_local once put 3 of 8 configurations at 0.79-0.83x,
beyond every step band. So the verdict judges runs, each one figure (tokens/s;
micro: computations/s, the mean of its repeats): faster only when every new run is
faster than every old run, slower only when every new run is slower, and only with
at least MIN_RUNS runs a side; "within noise" where the runs' ranges overlap,
"undetermined" with fewer runs.

Why ranges, and why 4 (MIN_RUNS): where nothing changed, the 2n runs are draws from
one distribution, whatever its shape or width, so every order of them is equally
likely, and the two sides' ranges fall apart in 2 of the C(2n, n) ways to pick
which n runs are old: 3 a side, 2/20 = 10% (8 unchanged configurations would show
a false claim more often than not); 4 a side, 2/70 = 2.9%, under the usual 5%, and
the two-sided exact Mann-Whitney test at 5% then claims exactly these cases. More
runs on either side only lower the chance (and widen the ranges). It needs no noise
figure of the machine, but it does need the runs to be exchangeable: load that
drifts between a block of old runs and a block of new ones can still part them, so
alternate old and new runs.

Startup (startup.startup_s: build + warmup seconds) is judged too, in its own rows and
words. Each run gives one figure, so its band is the runs' range widened by
STARTUP_SPREAD on each side: one run's startup is never flagged for less than a
change of about half, the range of identical runs on a shared 2-core machine. A
change in the compilation cache's outcome (a hit against a miss) is named beside
the verdict: it moves startup by itself.
"""

import math
import statistics

from tf_tput.records import results
from tf_tput.report import bands, configs, startup

FASTER = "faster (every new run above every old one)"
SLOWER = "slower (every new run below every old one)"
NOISE = "within noise (the runs' ranges overlap)"
STARTUP_FASTER = "startup faster (beyond noise)"
STARTUP_SLOWER = "startup slower (beyond noise)"
STARTUP_NOISE = "startup within noise"
NONE_SHARED = "no configuration has ok records in both files"
# How far a startup band reaches beyond its runs' range, as a fraction of it.
STARTUP_SPREAD = 0.2
# Runs a side before a verdict claims a change (why 4: the module docstring).
MIN_RUNS = 4
# Each run's one figure that the throughput verdict ranks, per record schema.
RUN_RATE = {results.SCHEMA: "tokens_per_sec", results.MICRO_SCHEMA: "computations_per_sec"}


def false_claim_odds() -> int:
  """N of "1 in N": how rarely MIN_RUNS unchanged runs a side part by chance."""
  return math.comb(2 * MIN_RUNS, MIN_RUNS) // 2


def _run_counts(old_count: int, new_count: int) -> str:
  if old_count == new_count:
    return f"{old_count} run{'' if old_count == 1 else 's'} a side"
  return f"old {old_count} run(s), new {new_count}"


def verdict(old_rates: list, new_rates: list) -> str:
  """Rates hold one figure per run: a claim needs every new run beyond every old one."""
  if min(len(old_rates), len(new_rates)) < MIN_RUNS:
    return (f"undetermined: {_run_counts(len(old_rates), len(new_rates))}; a claim needs "
            f"{MIN_RUNS} a side")
  if min(new_rates) > max(old_rates):
    return FASTER
  if max(new_rates) < min(old_rates):
    return SLOWER
  return NOISE


def _label(key: tuple, schema: str) -> str:
  if schema == results.SCHEMA:
    k = dict(zip(configs.TRAIN_KEY_FIELDS, key, strict=True))
    lengths = (f"{k['inputs_length']}/{k['targets_length']}" if k["inputs_length"]
               else f"{k['targets_length']}")
    return (f"{k['model']} {k['system']} {configs.dtype_label(k)} mesh {k['mesh_shape']} "
            f"({k['num_devices']} dev, {k['num_processes']} proc, {k['strategy']}"
            + (f", {k['launcher']}" if k["launcher"] else "") + ") "
            f"batch {k['global_batch']} len {lengths}")
  system, mode, hosts, per_host, chain, computations, matmul_n = key
  return (f"micro {system} {mode} {hosts} host(s) x {per_host}, chain {chain}, "
          f"{computations} computations" + (f", matmul {matmul_n}" if matmul_n else ""))


def _run_rates(records: list, schema: str) -> dict:
  """key -> each ok run's figure, over the records of `schema`."""
  ok = [r for r in records if r["schema"] == schema and r["status"] == "ok"]
  key = configs.train_key if schema == results.SCHEMA else configs.micro_key
  return {k: [r[RUN_RATE[schema]] for r in runs]
          for k, runs in bands.group(ok, key).items()}


def _range_cell(rates: list) -> str:
  return f"{statistics.median(rates):,.0f} [{min(rates):,.0f}–{max(rates):,.0f}]"


def startup_band(ok_runs: list):
  """(median, low, high) startup seconds of the runs that have it; None if none has."""
  seconds = [startup.startup_s(r) for r in ok_runs if startup.startup_s(r) is not None]
  if not seconds:
    return None
  return (statistics.median(seconds), min(seconds) * (1 - STARTUP_SPREAD),
          max(seconds) * (1 + STARTUP_SPREAD))


def startup_verdict(old_band: tuple, new_band: tuple) -> str:
  """Startup is time: a band above the old one is slower."""
  if new_band[1] > old_band[2]:
    return STARTUP_SLOWER
  if new_band[2] < old_band[1]:
    return STARTUP_FASTER
  return STARTUP_NOISE


def _cache_outcomes(runs: list) -> str:
  return "/".join(sorted({r.get("compilation_cache") or "none" for r in runs}))


def _startup_row(key, old_runs: list, new_runs: list):
  """The startup row of one train configuration, or None where a side has no figure."""
  o, n = startup_band(old_runs), startup_band(new_runs)
  if o is None or n is None:
    return None
  warmups = [sorted({r["warmup_steps"] for r in runs}) for runs in (old_runs, new_runs)]
  if warmups[0] != warmups[1] or len(warmups[0]) > 1:  # warmup_s counts those steps
    verdict = f"startup not judged: warmup steps differ (old {warmups[0]}, new {warmups[1]})"
  else:
    verdict = startup_verdict(o, n)
  old_cache, new_cache = _cache_outcomes(old_runs), _cache_outcomes(new_runs)
  if old_cache != new_cache:
    verdict += f" (compilation cache: old {old_cache}, new {new_cache})"
  counts = [sum(startup.startup_s(r) is not None for r in runs) for runs in (old_runs, new_runs)]
  return [_label(key, results.SCHEMA), "startup s", f"{counts[0]}/{counts[1]}",
          f"{o[0]:,.1f} [{o[1]:,.1f}–{o[2]:,.1f}]", f"{n[0]:,.1f} [{n[1]:,.1f}–{n[2]:,.1f}]",
          f"{n[0] / o[0]:.2f}x", verdict]


def _ok_train_groups(records: list) -> dict:
  return bands.group([r for r in records if r["schema"] == results.SCHEMA
                      and r["status"] == "ok"], configs.train_key)


def _throughput_row(label: str, unit: str, old_rates: list, new_rates: list) -> list:
  ratio = statistics.median(new_rates) / statistics.median(old_rates)
  return [label, unit, f"{len(old_rates)}/{len(new_rates)}", _range_cell(old_rates),
          _range_cell(new_rates), f"{ratio:.2f}x", verdict(old_rates, new_rates)]


def compare(old: list, new: list) -> tuple:
  """(header, rows, notes): one row per configuration with ok records in both (and a
  startup row per train one); notes name the configurations only one file has."""
  header = ["configuration", "unit", "runs old/new", "old median [range]",
            "new median [range]", "new/old", "verdict"]
  rows, notes = [], []
  old_runs, new_runs = _ok_train_groups(old), _ok_train_groups(new)
  for schema, unit in ((results.SCHEMA, "tokens/s"),
                       (results.MICRO_SCHEMA, "computations/s")):
    old_rates, new_rates = _run_rates(old, schema), _run_rates(new, schema)
    for key in old_rates:
      if key not in new_rates:
        notes.append(f"only in --compare (no ok record in --against): {_label(key, schema)}")
        continue
      rows.append(_throughput_row(_label(key, schema), unit, old_rates[key], new_rates[key]))
      if schema == results.SCHEMA:
        startup_row = _startup_row(key, old_runs[key], new_runs[key])
        if startup_row:
          rows.append(startup_row)
    notes += [f"only in --against (no ok record in --compare): {_label(key, schema)}"
              for key in new_rates if key not in old_rates]
  return header, rows, notes


def legend() -> str:
  """What the verdicts mean, printed under the comparison."""
  return (f"verdict: faster / slower only when, with at least {MIN_RUNS} runs a side, "
          "every new run lies above / below every old one (for unchanged code, by "
          f"chance at most 1 time in {false_claim_odds()}); a run's figure: its tokens/s "
          "(micro: computations/s); startup s, build + warmup: the runs' range "
          f"+-{STARTUP_SPREAD:.0%}")
