"""Grouping records, and the spread of a system's rate on one configuration.

The spread of tokens/s is defined once, in tokens_band, and used by every table and
plot (--compare judges the runs' own tokens/s instead: compare.py says why);
rate_band is the micro-benchmarks'.
"""

import statistics


def group(records: list, key) -> dict:
  """key(record) -> [records], in first-seen order."""
  groups = {}
  for r in records:
    groups.setdefault(key(r), []).append(r)
  return groups


def step_rate_band(r: dict) -> tuple:
  """(low, high) tokens/s of a run's p90 and p10 steps: its step-to-step spread."""
  st = r["step_time_s"]
  if not r["tokens_per_step"] or not st["p90"] or not st["p10"]:
    return (r["tokens_per_sec"], r["tokens_per_sec"])
  return (r["tokens_per_step"] / st["p90"], r["tokens_per_step"] / st["p10"])


def tokens_band(ok_runs: list) -> tuple:
  """(median tokens/s, low, high) over ok runs of one configuration and system.

  The band covers every run's p10-p90 step rate and every run's tokens/s, so it is
  wide enough for one run (step-to-step noise) and for several (run-to-run noise).
  """
  rates = [r["tokens_per_sec"] for r in ok_runs]
  bands = [step_rate_band(r) for r in ok_runs]
  return (statistics.median(rates), min(rates + [b[0] for b in bands]),
          max(rates + [b[1] for b in bands]))


def rate_band(ok_runs: list) -> tuple:
  """(median computations/s, low, high) over ok micro runs: repeats' range."""
  rates = [r["computations_per_sec"] for r in ok_runs]
  repeats = [x for r in ok_runs for x in r["repeats"]] or rates
  return statistics.median(rates), min(repeats + rates), max(repeats + rates)


def _si(x: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.3g}{unit}"
  return f"{x:.3g}"


def band_cell(band: tuple) -> str:
  """A (median, low, high) band as a table cell: '1,500 [1.2k–2.28k]'."""
  median, low, high = band
  return f"{median:,.0f} [{_si(low)}–{_si(high)}]"
