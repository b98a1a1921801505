"""The dispatch micro-benchmarks' tables: Fig. 5 (computations/s per host count) and
Fig. 6 (the crossover: each system's share of the reference system's rate)."""

import statistics

from tf_tput import micro
from tf_tput.report import bands


def _status(runs: list) -> str:
  """The cell of a column with no ok run: its last run's status, or 'not run'."""
  return runs[-1]["status"].replace("_", " ") if runs else "not run"


def micro_table(records: list) -> tuple:
  """(header, rows): Fig. 5 as numbers, one row per host count, one column per
  system x mode: median computations/s [repeats' min–max]."""
  order = list(micro.SYSTEMS)  # the single controller first
  columns = sorted({(r["system"], r["mode"]) for r in records},
                   key=lambda c: (order.index(c[0]) if c[0] in order else len(order), c[0],
                                  micro.MODES.index(c[1]) if c[1] in micro.MODES else 9))
  by_hosts = bands.group(sorted(records, key=lambda r: (r["hosts"], r["devices_per_host"])),
                         lambda r: (r["hosts"], r["devices_per_host"]))
  rows = []
  for (hosts, per_host), runs in by_hosts.items():
    row = [str(hosts), str(hosts * per_host)]
    for system, mode in columns:
      mine = [r for r in runs if (r["system"], r["mode"]) == (system, mode)]
      ok = [r for r in mine if r["status"] == "ok"]
      row.append(bands.band_cell(bands.rate_band(ok)) if ok else _status(mine))
    rows.append(row)
  return ["hosts", "devices"] + [f"{s} {m}" for s, m in columns], rows


def crossover_table(records: list) -> tuple:
  """(header, rows): Fig. 6 as numbers, one row per host count x matmul, with the
  duration asked for and the one measured here (small matmuls run below the
  calibrated rate, so the measured one is the x axis that holds), each system's
  median opbyop computations/s and every other system's share of the reference's
  (micro.REFERENCE, the multi-controller system)."""
  order, reference = list(micro.SYSTEMS), micro.REFERENCE
  names = sorted({r["system"] for r in records},
                 key=lambda s: (order.index(s) if s in order else len(order), s))
  others = [s for s in names if s != reference]
  groups = bands.group(sorted(records, key=lambda r: (r["hosts"], r["devices_per_host"],
                                                      r["computation_ms"] or 0,
                                                      r["matmul_n"])),
                       lambda r: (r["hosts"], r["devices_per_host"], r["computation_ms"],
                                  r["matmul_n"]))
  rows = []
  for (hosts, per_host, ms, n), runs in groups.items():
    measured = [r["computation_ms_measured"] for r in runs
                if r.get("computation_ms_measured") is not None]  # a later field
    row = [str(hosts), str(hosts * per_host), f"{ms:g}" if ms else "–",
           f"{statistics.median(measured):.3g}" if measured else "–", str(n)]
    medians = {}
    for s in names:
      ok = [r for r in runs if r["system"] == s and r["status"] == "ok"]
      if ok:
        medians[s] = bands.rate_band(ok)[0]
      row.append(f"{medians[s]:,.0f}" if ok else
                 _status([r for r in runs if r["system"] == s]))
    row += [f"{100 * medians[s] / medians[reference]:.0f}%"
            if s in medians and medians.get(reference) else "–" for s in others]
    rows.append(row)
  header = ["hosts", "devices", "ms asked", "ms measured", "matmul n"]
  header += [f"{s} computations/s" for s in names]
  header += [f"{s}/{reference}" for s in others]
  return header, rows
