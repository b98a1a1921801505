"""The console report: what `python -m tf_tput.report` prints without --out, and its
table of ok training runs, one row each. Kept apart from its entry point (which
defines flags) so that tests render it in-process."""

import textwrap

from tf_tput.report import configs, dispatch, footnotes, peaks, startup

COLUMNS = ("model", "system", "dtype", "mesh", "dev", "proc", "tokens/s",
           f"vs {configs.BASELINE_SYSTEM}", "step p10 / median / p90 (s)", "MFU",
           "MFU@best", "startup (s)", "final loss", "host")


def aligned(header: list, rows: list) -> str:
  table = [header] + rows
  widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
  return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                   for row in table)


def _ratio(r: dict, baselines: dict) -> str:
  base = baselines.get(configs.config_key(r))
  if not base or not r["tokens_per_sec"]:
    return "-"
  return f"{r['tokens_per_sec'] / base:.2f}x"


def _row(r: dict, baselines: dict, best: dict) -> tuple:
  st = r["step_time_s"]
  spread = ("-" if st["median"] is None else
            f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}")
  return (r["model"], r["system"], configs.dtype_label(r), r["mesh_shape"],
          str(r["num_devices"]), configs.launched_as(r, "num_processes"),
          "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:,.0f}",
          _ratio(r, baselines), spread,
          "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%", peaks.mfu_at_best(r, best),
          startup.startup_cell(r.get("build_s"), r.get("warmup_s"),
                               r.get("compilation_cache")),
          "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}",
          footnotes.host_cell(r))


def format_table(records: list) -> str:
  """One row per ok record (footnotes.partial_runs are listed apart); "vs mtf" is
  tokens/s over the baseline's on the same config (its latest ok record)."""
  ok = footnotes.ok_runs(records)
  baselines = {configs.config_key(r): r["tokens_per_sec"] for r in ok
               if r["system"] == configs.BASELINE_SYSTEM}
  best = peaks.best_peaks(ok)
  rows = [COLUMNS] + [_row(r, baselines, best) for r in ok]
  widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
           for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def _train(train: list) -> list:
  """The table of ok runs with its footnotes, then what report.md lists below its
  tables too (footnotes.partial_runs, footnotes.array_lines), then the peaks."""
  ok = footnotes.ok_runs(train)
  out = [format_table(ok) if ok else f"No ok training runs ({len(train)} partial)."]
  notes = footnotes.sharing_notes(ok)
  out += [""] + notes if notes else []
  partial = footnotes.partial_runs(train)
  if partial:
    out += ["", f"{footnotes.PARTIAL_HEADING}:"]
    out += [f"- {footnotes.partial_line(r)}" for r in partial]
  arrays = footnotes.array_lines(train)
  if arrays:
    out += ["", f"{footnotes.ARRAYS_HEADING}:"] + [f"- {a}" for a in arrays]
  if ok:
    out += ["", "MFU peaks, each once (every record's peak_source has the whole text):"]
    out += peaks.peak_lines(ok)
    out.append(textwrap.fill(
        "tokens/s counts non-padding tokens over measured steps (warmup excluded); "
        "MFU = model FLOP/s (3 x forward matmuls) / the run's own peak; MFU@best uses "
        "the best peak measured on the same hardware and dtype in these files; startup: "
        "build + warmup seconds before the first measured step (hit/miss: the "
        "compilation cache).",
        peaks.PEAKS_WIDTH))
  return out


def render(train: list, micro: list) -> str:
  out = _train(train) if train else []
  scalar = [r for r in micro if not r["matmul_n"]]
  if scalar:
    out += [""] if train else []
    out += ["computations/s (median over runs [range of timed repeats]):",
            aligned(*dispatch.micro_table(scalar))]
  crossover = [r for r in micro if r["matmul_n"]]
  if crossover:
    out += ["", "crossover (opbyop with a matmul; ms measured: its median time here):",
            aligned(*dispatch.crossover_table(crossover))]
  return "\n".join(out)
