"""report.md's Table 1: training throughput, one row per configuration and system,
beside the figures the paper published for the same model."""

import collections
import statistics

from tf_tput.report import bands, configs, footnotes, published, startup

PUBLISHED_TOKENS = "published JAX / Pathways tokens/s (TPUv3 cores)"


def _published_cells(r: dict) -> list:
  """The published columns of a record's rows: the paper's tokens/s and the MFU they
  imply on TPUv3 (Pathways' figure, which Table 1's JAX figure equals)."""
  figure = published.table_row(r)
  if not figure:
    return ["–", "–"]
  jax_tps, tps = figure.jax_tokens_per_sec, figure.pathways_tokens_per_sec
  return [f"{f'{jax_tps:,}' if jax_tps else '–'} / {tps:,} ({figure.cores})",
          published.implied_mfu_cell(r["model"], tps, figure.cores)]


def table1(records: list) -> tuple:
  """(header, rows): one row per configuration and system, baseline first, so that
  another system adds rows, not columns: its tokens/s with spread, median step time,
  MFU and runs, its ratio to the baseline system's tokens/s on the same configuration
  (configs.baseline_system), then the configuration's published figures and the MFU
  they imply on TPUv3 (published.implied_mfu)."""
  names, baseline = configs.systems_in(records), configs.baseline_system(records)
  header = ["model", "params", "dtype", "devices", "mesh", "strategy", "batch", "system",
            "runs", "tokens/s [spread]", "step median (s)", "MFU", f"vs {baseline}",
            "startup (s): build + warmup", PUBLISHED_TOKENS, published.IMPLIED_MFU]
  rows = []
  for runs in bands.group(records, configs.row_key).values():
    first = runs[0]
    config = [first["model"], f"{first['num_params'] / 1e6:,.1f}M",
              configs.dtype_label(first), str(first["num_devices"]), first["mesh_shape"],
              configs.launched_as(first, "strategy"), str(first["global_batch"])]
    pub_cells = _published_cells(first)
    ok_of = {s: [r for r in runs if r["system"] == s and r["status"] == "ok"]
             for s in names}
    base = bands.tokens_band(ok_of[baseline])[0] if ok_of[baseline] else None
    for s in names:
      ok, partial = ok_of[s], footnotes.partial_runs([r for r in runs if r["system"] == s])
      if not ok and not partial:
        continue  # not run on this configuration: no row
      if not ok:
        rows.append(config + [s, f"0 ({footnotes.status_counts(partial)})",
                              footnotes.NO_OK_RUN, "–", "–", "–", "–"] + pub_cells)
        continue
      rows.append(config + [s, _runs_cell(ok, partial), *_measured_cells(ok, base)]
                  + pub_cells)
  return header, rows


def _runs_cell(ok: list, partial: list) -> str:
  """How many ok runs, how many of them shared their host, and (+) the partial runs,
  which no figure counts: '4 (1 shared, +1 failed)'."""
  marks = collections.Counter(footnotes.sharing(r) for r in ok if footnotes.sharing(r))
  notes = [f"{marks[m]} {m}" for m in footnotes.SHARING_NOTES if marks[m]]
  notes += [f"+{footnotes.status_counts(partial)}"] if partial else []  # not counted
  return f"{len(ok)}" + (f" ({', '.join(notes)})" if notes else "")


def _measured_cells(ok: list, base) -> list:
  """tokens/s [spread], step median, MFU, the ratio to the baseline's median tokens/s
  `base` (None: no baseline run) and startup, over a system's ok runs."""
  band = bands.tokens_band(ok)
  mfus = [r["mfu"] for r in ok if r["mfu"] is not None]
  steps = [r["step_time_s"]["median"] for r in ok]
  started = [r for r in ok if startup.startup_s(r) is not None]
  return [bands.band_cell(band), f"{statistics.median(steps):.3f}",
          f"{100 * statistics.median(mfus):.1f}%" if mfus else "–",
          f"{band[0] / base:.2f}x" if base else "–",
          startup.startup_cell(statistics.median(r["build_s"] for r in started),
                               statistics.median(r["warmup_s"] for r in started),
                               startup.cache_outcome(started))
          if started else "–"]
