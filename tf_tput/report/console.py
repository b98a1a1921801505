"""The console report: what `python -m tf_tput.report` prints without --out. Kept
apart from its entry point (which defines flags) so that tests render it in-process."""

import textwrap

from tf_tput.report import tables


def aligned(header: list, rows: list) -> str:
  table = [header] + rows
  widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
  return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                   for row in table)


def _train(train: list) -> list:
  """The table of ok runs with its footnotes, then what report.md lists below its
  tables too (tables.partial_runs, tables.array_lines), then the peaks."""
  ok = tables.ok_runs(train)
  out = [tables.format_table(ok) if ok else f"No ok training runs ({len(train)} partial)."]
  notes = tables.sharing_notes(ok)
  out += [""] + notes if notes else []
  partial = tables.partial_runs(train)
  if partial:
    out += ["", f"{tables.PARTIAL_HEADING}:"]
    out += [f"- {tables.partial_line(r)}" for r in partial]
  arrays = tables.array_lines(train)
  if arrays:
    out += ["", f"{tables.ARRAYS_HEADING}:"] + [f"- {a}" for a in arrays]
  if ok:
    out += ["", "MFU peaks, each once (every record's peak_source has the whole text):"]
    out += tables.peak_lines(ok)
    out.append(textwrap.fill(
        "tokens/s counts non-padding tokens over measured steps (warmup excluded); "
        "MFU = model FLOP/s (3 x forward matmuls) / the run's own peak; MFU@best uses "
        "the best peak measured on the same hardware and dtype in these files; startup: "
        "build + warmup seconds before the first measured step (hit/miss: the "
        "compilation cache).",
        tables.PEAKS_WIDTH))
  return out


def render(train: list, micro: list) -> str:
  out = _train(train) if train else []
  scalar = [r for r in micro if not r["matmul_n"]]
  if scalar:
    out += [""] if train else []
    out += ["computations/s (median over runs [range of timed repeats]):",
            aligned(*tables.micro_table(scalar))]
  crossover = [r for r in micro if r["matmul_n"]]
  if crossover:
    out += ["", "crossover (opbyop with a matmul; ms measured: its median time here):",
            aligned(*tables.crossover_table(crossover))]
  return "\n".join(out)
