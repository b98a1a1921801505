"""report.md: the tables, the plots, the published figures, the conventions, the
versions and hardware, for the records of one or more result files."""

import datetime

from tf_tput import systems
from tf_tput.measure import peak as peak_lib
from tf_tput.records import results
from tf_tput.report import (bands, configs, dispatch, footnotes, islands_table,
                            published, table1, table2)

CONVENTIONS = [
    "**Warmup**: each run's first `warmup_steps` steps (graph build / compilation "
    "included) run but are not measured; `steps` counts measured steps.",
    "**tokens/s** = non-padding tokens of the measured steps / (completion time of "
    "the last measured step − completion time of the last warmup step). The clock "
    "reads once per window of `sync_every` steps (each step when it is 1), after the "
    "window's losses are on the host, so its steps have finished when it reads.",
    "**Tokens**: encoder inputs + decoder targets for T5 (encoder-decoder); targets "
    "for decoder-only models.",
    "**Spread** (brackets, whiskers): it covers every run's p10–p90 step rate "
    "(tokens per step / p90 and / p10 step time) and every run's tokens/s, so one "
    "run shows its step-to-step noise and several runs their run-to-run range. "
    "Micro-benchmarks: the range of the timed repeats.",
    "**Model FLOPs** = 3 × forward matmul FLOPs (2 per multiply-add): every dense "
    "projection, attention scores and values in full, output logits; embeddings, "
    "norms and elementwise ops not counted (tf_tput/models.py).",
    "**MFU** = model FLOP/s / (peak FLOP/s per device × devices), against the peak "
    "each run records (`peak_source`, listed below): a table entry on accelerators, "
    "a matmul measured in the run's own framework on CPUs.",
    "**Step times** are recorded as statistics (median, mean, p10, p90, min, max), "
    "not step by step; the step-time plot draws exactly those.",
    "**Virtual CPU devices** share the host's cores: a multi-device CPU run measures "
    "partitioning overhead, not a speed-up. Micro-benchmark hosts are local "
    "processes talking over loopback.",
]


def markdown(header: list, rows: list) -> str:
  def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
  lines = ["| " + " | ".join(map(cell, header)) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
  return "\n".join(lines)


def _implied_note() -> str:
  by_suite = bands.group(published.PAPER_SUITES, published.PAPER_SUITES.get)
  lengths = "; ".join(f"{', '.join(models)} at {_lengths(models[0])} "
                      f"(gin/suites/{suite}.gin)" for suite, models in by_suite.items())
  key = published.TPU_PEAK_KEY
  return (f"{published.IMPLIED_MFU} is this report's arithmetic, not the paper's: "
          "published tokens/s × model FLOPs per token (the convention below) / (TPUv3 "
          f"cores × {peak_lib.PEAK_FLOPS[key] / 1e12:g} TFLOP/s, the {key[1]} peak of a "
          f"{key[0]} core). The paper states no sequence lengths; the FLOPs per token are "
          f"at those the paper suites chose ({lengths}), and other lengths give another "
          "MFU.")


def _lengths(model: str) -> str:
  _, inputs, targets = published.paper_flops_per_token(model)
  return (f"{inputs}/{targets} input/target tokens" if inputs
          else f"{targets} tokens")


def _published_section() -> list:
  implied = published.implied_mfu_cell
  t1 = markdown(
      ["model", "params (published)", "TPUv3 cores", "JAX tokens/s", "Pathways tokens/s",
       published.IMPLIED_MFU],
      [[model, row.params, row.cores, f"{row.jax_tokens_per_sec:,}",
        f"{row.pathways_tokens_per_sec:,}",
        implied(model, row.pathways_tokens_per_sec, row.cores)]
       for model, row in published.TABLE1_T5.items()])
  t2 = markdown(
      ["configuration", "stages", "micro-batches", "TPUv3 cores", "Pathways tokens/s",
       published.IMPLIED_MFU],
      [[row.config, row.stages or "–", row.micro_batches or "–", row.cores,
        f"{row.tokens_per_sec:,}",
        implied(published.TABLE2_MODEL, row.tokens_per_sec, row.cores)]
       for row in published.TABLE2_DECODER_3B])
  f6 = "; ".join(f"{row.hosts} hosts ({row.tpus} TPUs, configuration {row.config}): "
                 f"{row.ms} ms" for row in published.FIG6_CROSSOVER_MS)
  return ["## Published figures", "",
          f"From {published.CITATION}, measured on {published.HARDWARE}; the paper does "
          "not state batch sizes or sequence lengths for Table 1. They are another "
          "machine's numbers at another scale: compare shapes and ratios, not values.",
          "", _implied_note(), "", "Table 1 (T5 training throughput):", "", t1, "",
          f"Table 2 (3B decoder-only LM, `{published.TABLE2_MODEL}`):", "", t2, "",
          f"Fig. 6 (smallest computation at which Pathways matches JAX): {f6}.", "",
          published.FIG5_NOTE, ""]


def _train_section(train: list, plots: dict) -> list:
  header, rows = table1.table1(train)
  out = ["## Training throughput (Table 1 style)", "", markdown(header, rows), "",
         "One row per configuration and system. runs: its ok runs (how many shared "
         "their host, marked below), then (+) its failed and interrupted runs, which "
         "no figure counts; tokens/s: median over the system's ok "
         "runs of the configuration, [spread]; step median: the median of those runs' "
         "median step times; MFU: median against each run's own peak; "
         f"vs {configs.baseline_system(train)}: the row's median tokens/s over that "
         "system's on the same configuration. The published columns are the paper's "
         "figures for a model of the same name on TPUv3 at the paper's core counts "
         f"({published.CITATION}), the same on every system's row; another machine and "
         "scale, never divided by a local figure.", ""]
  notes = footnotes.sharing_notes(footnotes.ok_runs(train))
  out += [f"- {note}" for note in notes] + ([""] if notes else [])
  if plots.get("tokens_per_sec"):
    out += [f"![tokens/s per system and model]({plots['tokens_per_sec']})", ""]
  if any(r["arch"] == "decoder" for r in train):
    header, rows = table2.table2(train)
    out += ["## Partitioning a decoder (Table 2 style)", "", markdown(header, rows),
            "", "Runs of one model, dtype, device count, global batch and length; 'vs "
            "SPMD' divides by the same system's fastest SPMD row there. bubble: the "
            "GPipe schedule's idle fraction (S-1)/(M+S-1), theoretical. Virtual CPU "
            "devices share the host's cores, so a local pipeline shows its scheduling "
            "and transfer costs, not a speed-up.", ""]
  if any(r.get("islands", 1) > 1 for r in train):
    header, rows = islands_table.islands_table(train)
    out += ["## Across islands (§5.3 style)", "", markdown(header, rows), "",
            "Runs of one model, pipeline, device count, process count, batch and "
            "length; 'of 1 island' divides by the same system's run with its processes "
            "on loopback. Link bytes: what the islands' link ends sent per measured "
            "step, and what the system's own schedule predicts: data parallel, 2(K-1) "
            "times the bytes its hierarchical reduction reduces (a float32 gradient per "
            "parameter for jax, more for mtf, which reduces the relative bias's "
            "activation-shaped gradient; for torch and ray a flat ring over their "
            "processes or actors, and for ray the batch too, pulled by each island but "
            "the driver's); a pipeline (S x M, its stages split across "
            "the islands), the activations and gradients sent over the stage boundaries "
            "on the links and the shared embedding's gradient (jax) or copy (mtf). The "
            "ideal-link projection is the unshaped islands run's step plus the bytes "
            "one island sends at the link's rate; paper scale: tf_tput.plan --islands.",
            ""]
  partial = footnotes.partial_runs(train)
  if partial:
    out += [f"### {footnotes.PARTIAL_HEADING}", ""]
    out += [f"- {footnotes.partial_line(r)}" for r in partial] + [""]
  out += ["## Step-time distributions", ""]
  if plots.get("step_times"):
    out += [f"![step times per run]({plots['step_times']})", ""]
  out += ["MFU peaks of the ok runs (whole machine, per system and dtype; each run's "
          "`peak_source` is in results.csv): " + _peaks(train), ""]
  arrays = footnotes.array_lines(train)
  if arrays:
    out += [f"## {footnotes.ARRAYS_HEADING}", ""] + [f"- {a}" for a in arrays] + [""]
  return out


def _peaks(train: list) -> str:
  parts = []
  for (system, dtype, kind), runs in sorted(bands.group(
      [r for r in footnotes.ok_runs(train) if r["peak_flops_per_device"]],
      lambda r: (r["system"], r["dtype"], r["peak_source"].split(":")[0])).items()):
    whole = [r["peak_flops_per_device"] * r["num_devices"] / 1e9 for r in runs]
    parts.append(f"{system} {dtype} {kind} {min(whole):,.0f}–{max(whole):,.0f} GFLOP/s "
                 f"({len(runs)} run(s))")
  return "; ".join(parts) or "none recorded"


def _micro_section(micro: list, plots: dict) -> list:
  scalar = [r for r in micro if not r["matmul_n"]]
  header, rows = dispatch.micro_table(scalar) if scalar else ([], [])
  out = ["## Dispatch micro-benchmarks (Fig. 5 style)", ""]
  if rows:
    out += ["computations/s: median over runs [range of timed repeats].", "",
            markdown(header, rows), ""]
  else:
    out += ["No records without a matmul; the crossover's are below.", ""]
  if plots.get("fig5"):
    out += [f"![computations/s against hosts]({plots['fig5']})", ""]
  others = [r for r in micro if r["status"] not in ("ok",)]
  if others:
    out += ["Runs that did not measure:", ""]
    out += [f"- {r['system']} {r['mode']} {r['hosts']} host(s): {r['status']}: "
            f"{r['error']}" for r in others]
    out.append("")
  crossover = [r for r in micro if r["matmul_n"]]
  if crossover:
    out += ["## Crossover (Fig. 6 style)", "",
            "opbyop computations/s with an n x n float32 matmul before each AllReduce, "
            "sized from one calibrated rate per invocation; `ms measured` is that "
            "matmul's median time here (numpy), the duration to read the crossover at.",
            "", markdown(*dispatch.crossover_table(crossover)), ""]
  return out


def _environments(records: list) -> list:
  python, *rest = [k for k in results.ENV_KEYS if k != "accelerators"]
  keys = (python, *systems.distributions(), *rest, "cpu_count")
  # Accelerator kinds without their counts: a 1-device and a 4-device run on the
  # same machine share a row.
  combos = bands.group(records, lambda r: tuple(str(r["env"].get(k)) for k in keys) + (
      ", ".join(sorted({f"{a.get('platform')}: {a.get('kind')}"
                        for a in r["env"].get("accelerators") or []})),))
  rows = []
  for combo, runs in combos.items():
    commits = sorted({(r["git_commit"] or "unknown")[:7] + ("+dirty" if "+dirty" in (r["git_commit"] or "") else "") for r in runs})
    rows.append(list(combo) + [", ".join(commits), len(runs)])
  return ["## Versions and hardware", "",
          markdown(list(keys) + ["accelerators", "git commits", "records"], rows), ""]


def render(train: list, micro: list, sources: list, problems: list, plots: dict) -> str:
  """sources: [(path, train count, micro count, records dropped as already read)];
  problems: [(path, line, why)];
  plots: name -> file name relative to report.md (absent when not drawn)."""
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  out = ["# tf_tput report", "", f"Generated {now} from:", ""]
  out += [f"- `{path}`: {n_train} training record(s), {n_micro} micro-benchmark record(s)"
          + (f", {dropped} dropped (their run_id was read before)" if dropped else "")
          for path, n_train, n_micro, dropped in sources]
  out.append("")
  if problems:
    out += ["Lines that are not records (skipped):", ""]
    out += [f"- `{path}:{line}`: {why}" for path, line, why in problems]
    out.append("")
  out += (_train_section(train, plots) if train else
          ["## Training throughput (Table 1 style)", "", "No training records.", ""])
  out += (_micro_section(micro, plots) if micro else
          ["## Dispatch micro-benchmarks (Fig. 5 style)", "",
           "No micro-benchmark records.", ""])
  out += _published_section()
  out += ["## Conventions", "", "A summary; docs/measurement.md in the tf_tput repository "
          "is the whole account.", ""] + [f"- {c}" for c in CONVENTIONS] + [""]
  out += _environments(train + micro)
  out += ["Record schemas read: "
          + ", ".join(sorted({r["schema"] for r in train + micro})), ""]
  return "\n".join(out)
