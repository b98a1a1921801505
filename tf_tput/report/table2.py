"""report.md's Table 2: partitioning a decoder, SPMD against pipelines, beside the
paper's figures for decoder_3b."""

from tf_tput.report import bands, configs, footnotes, published

PUBLISHED_SPMD = next(row for row in published.TABLE2_DECODER_3B if row.config == "spmd")


def _partitioning(r: dict) -> str:
  stages = r.get("pipeline_stages") or 1
  if stages == 1:
    return f"SPMD {r['mesh_shape']}"
  return f"pipeline {stages}x{r.get('micro_batches')}, {r['mesh_shape']} per stage"


def table2(records: list) -> tuple:
  """(header, rows): Table 2 as numbers. Decoder-only runs grouped by model, dtype,
  devices, global batch and length (the paper's pitfall: hold those constant), one
  row per partitioning (SPMD mesh or S x M pipeline), per system its tokens/s and its
  ratio to its own fastest SPMD row of the group, then the published Pathways figure
  for the same S x M (decoder_3b only) and its ratio to the published SPMD row."""
  decoders = [r for r in records if r["arch"] == "decoder"]
  names = configs.systems_in(decoders)
  header = ["model", "dtype", "devices", "batch x length", "partitioning", "bubble"]
  for s in names:
    header += [f"{s} tokens/s [spread]", f"{s} vs SPMD"]
  header += ["published Pathways tokens/s (TPUv3 cores)", "published vs SPMD"]
  by_group = bands.group(decoders, lambda r: (r["model"], r["dtype"], r["num_devices"],
                                              r["global_batch"], r["targets_length"]))
  rows = []
  for runs in by_group.values():
    medians = {}  # (partitioning, system) -> tokens_band
    for key, mine in bands.group(runs, lambda r: (_partitioning(r), r["system"])).items():
      ok = [r for r in mine if r["status"] == "ok"]
      if ok:
        medians[key] = bands.tokens_band(ok)
    spmd = {}  # per system its fastest SPMD row: what a pipeline has to beat
    for (part, s), band in medians.items():
      if part.startswith("SPMD"):
        spmd[s] = max(spmd.get(s, 0), band[0])
    for part, mine in bands.group(runs, _partitioning).items():
      first = mine[0]
      row = [first["model"], first["dtype"], str(first["num_devices"]),
             f"{first['global_batch']} x {first['targets_length']}", part,
             f"{first.get('bubble_fraction') or 0:.3f}"]
      for s in names:
        band = medians.get((part, s))
        tried = any(r["system"] == s for r in mine)
        row += ([bands.band_cell(band), f"{band[0] / spmd[s]:.2f}x" if s in spmd else "–"]
                if band else [footnotes.NO_OK_RUN if tried else "not run", "–"])
      rows.append(row + _published_cells(first))
  return header, rows


def _published_cells(r: dict) -> list:
  figure = published.table_row(r)
  if not figure:
    return ["–", "–"]
  tps = figure.pathways_tokens_per_sec
  return [f"{tps:,} ({figure.cores})", f"{tps / PUBLISHED_SPMD.tokens_per_sec:.2f}x"]
