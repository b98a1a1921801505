"""--compare: the configurations two result files share, and whether each one's
throughput changed by more than its noise.

A raw percentage says nothing about noise: CPU runs move by 10-20% between runs.
The verdict compares spreads instead (tables.tokens_band: every run's p10-p90 step
rate and every run's tokens/s; micro records: their repeats' range). The new
configuration is faster only when its whole band lies above the old band, slower
only when it lies below; overlapping bands are "within noise". A band drawn from
fewer than MIN_SAMPLES measurements shows little or no noise, so such a comparison
is "undetermined" instead.

Startup (tables.startup_s: build + warmup seconds) is judged too, in its own rows and
words. Each run gives one figure, so its band is the runs' range widened by
STARTUP_SPREAD on each side: one run's startup is never flagged for less than a
change of about half, the range of identical runs on a shared 2-core machine. A
change in the compilation cache's outcome (a hit against a miss) is named beside
the verdict: it moves startup by itself.
"""

import statistics

from tf_tput.records import results
from tf_tput.report import tables

FASTER = "faster (beyond the spread)"
SLOWER = "slower (beyond the spread)"
NOISE = "within noise (spreads overlap)"
STARTUP_FASTER = "startup faster (beyond noise)"
STARTUP_SLOWER = "startup slower (beyond noise)"
STARTUP_NOISE = "startup within noise"
# How far a startup band reaches beyond its runs' range, as a fraction of it.
STARTUP_SPREAD = 0.2
# Measurements a band needs: measured steps; timed repeats (each already the mean of
# --computations calls, as the suites' 3 repeats are).
MIN_SAMPLES = {results.SCHEMA: 5, results.MICRO_SCHEMA: 3}


def verdict(old_band: tuple, new_band: tuple, old_samples: int, new_samples: int,
            min_samples: int) -> str:
  """Bands are (median, low, high); samples count the measurements behind each."""
  if min(old_samples, new_samples) < min_samples:
    return (f"undetermined: too few measurements for a spread (old {old_samples}, new "
            f"{new_samples}; need {min_samples}: more steps or repeats)")
  if new_band[1] > old_band[2]:
    return FASTER
  if new_band[2] < old_band[1]:
    return SLOWER
  return NOISE


def _label(key: tuple, schema: str) -> str:
  if schema == results.SCHEMA:
    k = dict(zip(tables.TRAIN_KEY_FIELDS, key, strict=True))
    lengths = (f"{k['inputs_length']}/{k['targets_length']}" if k["inputs_length"]
               else f"{k['targets_length']}")
    return (f"{k['model']} {k['system']} {tables.dtype_label(k)} mesh {k['mesh_shape']} "
            f"({k['num_devices']} dev, {k['num_processes']} proc, {k['strategy']}"
            + (f", {k['launcher']}" if k["launcher"] else "") + ") "
            f"batch {k['global_batch']} len {lengths}")
  system, mode, hosts, per_host, chain, computations, matmul_n = key
  return (f"micro {system} {mode} {hosts} host(s) x {per_host}, chain {chain}, "
          f"{computations} computations" + (f", matmul {matmul_n}" if matmul_n else ""))


def _bands(records: list, schema: str) -> dict:
  """key -> (band, samples) over the ok records of `schema`."""
  ok = [r for r in records if r["schema"] == schema and r["status"] == "ok"]
  if schema == results.SCHEMA:
    groups, band = tables.group(ok, tables.train_key), tables.tokens_band
  else:
    groups, band = tables.group(ok, tables.micro_key), tables.rate_band
  return {k: (band(runs), tables.samples(runs)) for k, runs in groups.items()}


def startup_band(ok_runs: list):
  """(median, low, high) startup seconds of the runs that have it; None if none has."""
  seconds = [tables.startup_s(r) for r in ok_runs if tables.startup_s(r) is not None]
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
  return [_label(key, results.SCHEMA), "startup s", f"{o[0]:,.1f} [{o[1]:,.1f}–{o[2]:,.1f}]",
          f"{n[0]:,.1f} [{n[1]:,.1f}–{n[2]:,.1f}]", f"{n[0] / o[0]:.2f}x", verdict]


def _ok_train_groups(records: list) -> dict:
  return tables.group([r for r in records if r["schema"] == results.SCHEMA
                       and r["status"] == "ok"], tables.train_key)


def compare(old: list, new: list) -> tuple:
  """(header, rows, notes): one row per configuration with ok records in both."""
  header = ["configuration", "unit", "old median [spread]", "new median [spread]",
            "new/old", "verdict"]
  rows, notes = [], []
  old_runs, new_runs = _ok_train_groups(old), _ok_train_groups(new)
  for schema, unit in ((results.SCHEMA, "tokens/s"),
                       (results.MICRO_SCHEMA, "computations/s")):
    old_bands, new_bands = _bands(old, schema), _bands(new, schema)
    for key in old_bands:
      if key not in new_bands:
        notes.append(f"only in --compare (no ok record in --against): {_label(key, schema)}")
        continue
      (o, o_samples), (n, n_samples) = old_bands[key], new_bands[key]
      rows.append([_label(key, schema), unit,
                   f"{o[0]:,.0f} [{o[1]:,.0f}–{o[2]:,.0f}]",
                   f"{n[0]:,.0f} [{n[1]:,.0f}–{n[2]:,.0f}]",
                   f"{n[0] / o[0]:.2f}x", verdict(o, n, o_samples, n_samples, MIN_SAMPLES[schema])])
      if schema == results.SCHEMA:
        startup = _startup_row(key, old_runs[key], new_runs[key])
        if startup:
          rows.append(startup)
    notes += [f"only in --against (no ok record in --compare): {_label(key, schema)}"
              for key in new_bands if key not in old_bands]
  return header, rows, notes
