"""PNG plots of result records (matplotlib, Agg backend: no display needed).

Each function writes one file and returns its path, or None when the records hold
nothing to plot. Spreads are those of tf_tput/report/bands.py.
"""

import matplotlib

matplotlib.use("Agg")  # before pyplot: files only, never a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter  # noqa: E402

from tf_tput import micro  # noqa: E402
from tf_tput.report import bands, configs, footnotes  # noqa: E402

DPI = 120
MODES_ORDER = micro.MODES
MODE_STYLES = {"opbyop": "-", "chained": "--", "fused": ":"}


def _save(fig, path: str) -> str:
  fig.tight_layout()
  fig.savefig(path, dpi=DPI)
  plt.close(fig)
  return path


def _config_label(r: dict) -> str:
  return (f"{r['model']}\n{configs.dtype_label(r)} {r['mesh_shape']}\n"
          f"batch {r['global_batch']}"
          + ("" if r["strategy"] == "local" else f", {r['strategy']}"))


def tokens_per_sec(records: list, path: str):
  """Bars: median tokens/s per configuration (groups) and system (bars), whiskers
  the spread; log scale, since tiny and base models differ a hundredfold."""
  by_config = bands.group(records, configs.row_key)
  names = configs.systems_in(records)
  if not any(r["status"] == "ok" for r in records):
    return None
  fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(by_config) * len(names) / 2 + 3), 5))
  width = 0.8 / len(names)
  for i, system in enumerate(names):
    xs, heights, low_err, high_err = [], [], [], []
    for x, runs in enumerate(by_config.values()):
      ok = [r for r in runs if r["system"] == system and r["status"] == "ok"]
      if not ok:
        mine = [r for r in runs if r["system"] == system]
        ax.annotate(footnotes.NO_OK_RUN if mine else "not run",
                    (x + (i - (len(names) - 1) / 2) * width, 0),
                    xycoords=("data", "axes fraction"), ha="center", va="bottom",
                    rotation=90, fontsize=8, color="gray")
        continue
      median, low, high = bands.tokens_band(ok)
      xs.append(x + (i - (len(names) - 1) / 2) * width)
      heights.append(median)
      low_err.append(median - low)
      high_err.append(high - median)
    ax.bar(xs, heights, width, yerr=[low_err, high_err], capsize=3, label=system)
  ax.set_xticks(range(len(by_config)))
  ax.set_xticklabels([_config_label(runs[0]) for runs in by_config.values()], fontsize=8)
  ax.set_yscale("log")
  ax.set_ylabel("tokens/s (log scale)")
  ax.set_title("Training throughput per system: median, whiskers = spread\n"
               "(every run's p10–p90 step rate and run-to-run range)", fontsize=10)
  ax.legend(title="system")
  ax.grid(axis="y", which="both", alpha=0.3)
  return _save(fig, path)


def fig5(records: list, path: str):
  """Computations/s against hosts, one line per system x mode, log scale (Fig. 5)."""
  ok = [r for r in records if r["status"] == "ok" and not r["matmul_n"]]
  if not ok:
    return None
  lines = bands.group(sorted(ok, key=lambda r: r["hosts"]),
                      lambda r: (r["system"], r["mode"], r["devices_per_host"]))
  fig, ax = plt.subplots(figsize=(8, 5))
  colors = {}
  order = list(micro.SYSTEMS)
  for (system, mode, per_host), runs in sorted(
      lines.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else 9,
                                     kv[0][0], MODES_ORDER.index(kv[0][1]))):
    by_hosts = bands.group(runs, lambda r: r["hosts"])
    hosts = sorted(by_hosts)
    spreads = [bands.rate_band(by_hosts[h]) for h in hosts]
    color = colors.setdefault(system, f"C{len(colors)}")
    ax.errorbar(hosts, [b[0] for b in spreads],
                yerr=[[b[0] - b[1] for b in spreads], [b[2] - b[0] for b in spreads]],
                fmt="o" + MODE_STYLES.get(mode, "-"), color=color, capsize=3,
                label=f"{system} {mode} ({per_host} dev/host)")
  all_hosts = sorted({r["hosts"] for r in ok})
  ax.set_xscale("log", base=2)
  ax.xaxis.set_major_locator(FixedLocator(all_hosts))
  ax.xaxis.set_major_formatter(ScalarFormatter())
  ax.xaxis.set_minor_locator(NullLocator())
  ax.set_yscale("log")
  ax.set_xlabel("hosts (local processes)")
  ax.set_ylabel("computations/s (log scale)")
  ax.set_title("Dispatch overhead (Pathways Fig. 5 at local scale): scalar AllReduce + add\n"
               "median of repeats, whiskers = repeats' range", fontsize=10)
  ax.legend(fontsize=8)
  ax.grid(which="both", alpha=0.3)
  return _save(fig, path)


def step_times(records: list, path: str):
  """One box per ok run: p10-p90 box, median line, min-max whiskers, mean marker.

  Records keep these statistics, not every step's duration, so the boxes show
  exactly what was recorded.
  """
  runs = [r for r in footnotes.ok_runs(records) if r["step_time_s"]["median"] is not None]
  if not runs:
    return None
  stats = [{"label": f"{r['model']} {r['system']} {r['dtype']} {r['mesh_shape']} "
                     f"b{r['global_batch']} (n={r['steps']}, run {r['run_id'][:6]})",
            "whislo": r["step_time_s"]["min"], "q1": r["step_time_s"]["p10"],
            "med": r["step_time_s"]["median"], "q3": r["step_time_s"]["p90"],
            "whishi": r["step_time_s"]["max"], "mean": r["step_time_s"]["mean"],
            "fliers": []} for r in reversed(runs)]  # the first run on top
  fig, ax = plt.subplots(figsize=(9, max(3.0, 0.45 * len(stats) + 1.5)))
  ax.bxp(stats, orientation="horizontal", showmeans=True)
  ax.set_xscale("log")
  ax.set_xlabel("step time, s (log scale)")
  ax.tick_params(axis="y", labelsize=7)
  ax.set_title("Measured step times per run (n = measured steps)\n"
               "box p10–p90, line median, triangle mean, whiskers min–max", fontsize=10)
  ax.grid(axis="x", which="both", alpha=0.3)
  return _save(fig, path)
