"""--compare: the configurations two result files share, and whether each one's
throughput changed by more than its noise.

A raw percentage says nothing about noise: CPU runs move by 10-20% between runs.
The verdict compares spreads instead (tables.tokens_band: every run's p10-p90 step
rate and every run's tokens/s; micro records: their repeats' range). The new
configuration is faster only when its whole band lies above the old band, slower
only when it lies below; overlapping bands are "within noise". A band drawn from
fewer than MIN_SAMPLES measurements shows little or no noise, so such a comparison
is "undetermined" instead.
"""

from tf_tput.records import results
from tf_tput.report import tables

FASTER = "faster (beyond the spread)"
SLOWER = "slower (beyond the spread)"
NOISE = "within noise (spreads overlap)"
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
    k = dict(zip(tables.TRAIN_KEY_FIELDS, key))
    lengths = (f"{k['inputs_length']}/{k['targets_length']}" if k["inputs_length"]
               else f"{k['targets_length']}")
    return (f"{k['model']} {k['system']} {tables.dtype_label(k)} mesh {k['mesh_shape']} "
            f"({k['num_devices']} dev, {k['num_processes']} proc, {k['strategy']}) "
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


def compare(old: list, new: list) -> tuple:
  """(header, rows, notes): one row per configuration with ok records in both."""
  header = ["configuration", "unit", "old median [spread]", "new median [spread]",
            "new/old", "verdict"]
  rows, notes = [], []
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
    notes += [f"only in --against (no ok record in --compare): {_label(key, schema)}"
              for key in new_bands if key not in old_bands]
  return header, rows, notes
