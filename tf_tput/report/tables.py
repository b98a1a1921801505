"""Tables from result records: the console table, the Table-1, Fig.-5 and Fig.-6
tables of report.md, and the rows of results.csv.

The spread of a system's tokens/s on one configuration is defined once, in
tokens_band, and used by every table and plot (--compare judges the runs' own
tokens/s instead: compare.py says why).
"""

import collections
import json
import statistics
import textwrap

from tf_tput import micro, systems
from tf_tput.measure import peak as peak_lib
from tf_tput.records import results
from tf_tput.report import published
from tf_tput.runtime import cpus

BASELINE_SYSTEM = systems.DEFAULT  # the paper's TF baseline: ratios divide by it
COLUMNS = ("model", "system", "dtype", "mesh", "dev", "proc", "tokens/s",
           f"vs {BASELINE_SYSTEM}", "step p10 / median / p90 (s)", "MFU", "MFU@best",
           "startup (s)", "final loss", "host")
# Records that differ only in their system are the same configuration. The embedding
# is part of it: a row lookup does less arithmetic than mtf's one-hot matmul. Records
# from before a field existed (results.LATER_FIELDS) have None there. sync_every too:
# fetching the loss every k steps lets an asynchronous system overlap steps.
CONFIG_KEYS = ("model", "dtype", "embedding", "mesh_shape", "layout", "num_devices",
               "global_batch", "inputs_length", "targets_length", "sync_every",
               "pipeline_stages", "micro_batches")
# What a record from before a field means by its absence, where that is known: the
# loop fetched every step's loss before sync_every existed, and no system pipelined. (An old jax record's
# embedding is not known to be one_hot: it stays None, its own configuration.)
ABSENT_MEANS = {"sync_every": 1, "pipeline_stages": 1, "micro_batches": 1}


def variant_as_system(r: dict) -> dict:
  """A record run in a variant of its system (its `variant`: non-default options,
  scanned layers) as a system of its own, "torch [TorchOptions.compile=True]": every
  table, plot and --compare then gives it its own row and band, and its ratio to the
  baseline on the same configuration (a variant keeps the arithmetic)."""
  if not r.get("variant"):
    return r
  return {**r, "system": f"{r['system']} [{r['variant']}]"}


def config_key(r: dict) -> tuple:
  return tuple(r.get(k, ABSENT_MEANS.get(k)) for k in CONFIG_KEYS)


def dtype_label(r: dict) -> str:
  """The dtype, the embedding where it is not mtf's one-hot matmul, sync_every where
  the loss is not fetched every step, and a pipeline's stages x micro-batches."""
  embedding, sync = r.get("embedding"), r.get("sync_every")
  stages = r.get("pipeline_stages") or 1
  return (r["dtype"] + (f" {embedding}" if embedding not in (None, "one_hot") else "")
          + (f" sync {sync}" if sync not in (None, 1) else "")
          + (f" pipeline {stages}x{r.get('micro_batches')}" if stages > 1 else ""))


def _ratio(r: dict, baselines: dict) -> str:
  base = baselines.get(config_key(r))
  if not base or not r["tokens_per_sec"]:
    return "-"
  return f"{r['tokens_per_sec'] / base:.2f}x"


def _hardware(r: dict) -> tuple:
  """What makes two records the same machine for MFU@best: the CPU model, the
  accelerators' platform and kind, the devices per worker and the dtype. Never a
  worker's task or address: a cluster relaunched on other ports is the same machine."""
  accelerators = r["env"]["accelerators"] or []
  kinds = tuple(sorted({(a.get("platform"), a.get("kind")) for a in accelerators}))
  counts = tuple(sorted(a.get("count") or 0 for a in accelerators))
  return (r["env"]["cpu"], kinds, counts, r["num_devices"], r["dtype"])


def best_peaks(records: list) -> dict:
  """Per hardware and dtype, the highest whole-machine peak any ok record measured.

  Each system's MFU is against its own framework's matmul peak; MFU@best puts every
  system on the same machine and dtype against one peak, the best either reached.
  """
  best = {}
  for r in ok_runs(records):
    if r["peak_flops_per_device"]:
      whole = r["peak_flops_per_device"] * r["num_devices"]
      best[_hardware(r)] = max(best.get(_hardware(r), 0), whole)
  return best


def _mfu_at_best(r: dict, peaks: dict) -> str:
  peak = peaks.get(_hardware(r))
  if not peak or not r["model_tflops_per_sec"]:
    return "-"
  return f"{100 * r['model_tflops_per_sec'] * 1e12 / peak:.1f}%"


def startup_s(r: dict):
  """Seconds from the run's start to its first measured step: build_s + warmup_s (the
  compile and the first step are inside warmup_s; docs/measurement.md, "Startup").
  None where a record lacks either (a failed run, a record older than the fields)."""
  build, warmup = r.get("build_s"), r.get("warmup_s")
  return None if build is None or warmup is None else build + warmup


def startup_cell(build_s, warmup_s, cache=None) -> str:
  """'build + warmup' seconds, with the compilation cache's hit, miss or mixed."""
  if build_s is None or warmup_s is None:
    return "-"
  return f"{build_s:.1f} + {warmup_s:.1f}" + (
      f" {cache}" if cache in ("hit", "miss", "mixed") else "")


def _cache_outcome(runs: list):
  """The runs' compilation cache outcome: theirs where they agree, "mixed" where some
  hit and some missed (a median over both is neither a cold nor a warm start)."""
  outcomes = {r.get("compilation_cache") for r in runs}
  return outcomes.pop() if len(outcomes) == 1 else "mixed"


def _row(r: dict, baselines: dict, peaks: dict) -> tuple:
  st = r["step_time_s"]
  spread = ("-" if st["median"] is None else
            f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}")
  return (r["model"], r["system"], dtype_label(r), r["mesh_shape"], str(r["num_devices"]),
          launched_as(r, "num_processes"),
          "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:,.0f}",
          _ratio(r, baselines), spread,
          "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%", _mfu_at_best(r, peaks),
          startup_cell(r.get("build_s"), r.get("warmup_s"), r.get("compilation_cache")),
          "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}",
          host_cell(r))


def format_table(records: list) -> str:
  """One row per ok record (partial_runs are listed apart); "vs mtf" is tokens/s over
  the baseline's on the same config (its latest ok record)."""
  ok = ok_runs(records)
  baselines = {config_key(r): r["tokens_per_sec"] for r in ok
               if r["system"] == BASELINE_SYSTEM}
  peaks = best_peaks(ok)
  rows = [COLUMNS] + [_row(r, baselines, peaks) for r in ok]
  widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
           for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


# --------------------------------------------------------------------------------
# What both reports say below their tables: partial runs, shared hosts, job arrays.

# Statuses of runs that did not measure to the end: every table leaves them out and
# every report lists them below its tables.
PARTIAL_STATUSES = tuple(s for s in results.STATUSES if s != "ok")
PARTIAL_HEADING = f"{' and '.join(PARTIAL_STATUSES).capitalize()} runs (in no table)"
NO_OK_RUN = "no ok run"  # a table cell where every run of it was partial


def ok_runs(records: list) -> list:
  return [r for r in records if r["status"] == "ok"]


def partial_runs(records: list) -> list:
  """The records no table holds, in the order read."""
  return [r for r in records if r["status"] in PARTIAL_STATUSES]


def partial_line(r: dict) -> str:
  """What a partial run was, its status and why."""
  return (f"{r['model']} {r['system']} {dtype_label(r)} {r['mesh_shape']} batch "
          f"{r['global_batch']} (run {r['run_id']}, {r['started_at']}): "
          f"{r['status']}: {r['error']}")


def status_counts(runs: list) -> str:
  """'2 ok, 1 interrupted': runs per status, in results.STATUSES order."""
  counts = collections.Counter(r["status"] for r in runs)
  return ", ".join(f"{counts[s]} {s}" for s in results.STATUSES if counts[s])


# How a run's host was shared while it measured -> what its mark means. Records from
# before concurrent_runs and packed lack them: not marked.
SHARING_NOTES = {
    "shared": "another tf_tput train run was live on the same host while it ran, "
              "unasked, so its tokens/s is likely low; rerun it alone",
    "packed": "it shared its host with other tf_tput train runs as asked (train "
              "--packed); its tokens/s is a shared host's",
}


def sharing(r: dict):
  """The run's mark (a key of SHARING_NOTES) where other runs were live on its host,
  else None."""
  if not r.get("concurrent_runs"):
    return None
  return "packed" if r.get("packed") else "shared"


def cpus_note(r: dict):
  """runtime/cpus.py's line where the recording process ran on fewer CPUs than its
  host has (a launcher's binding); None where it had them all, or the record is older
  than env.cpu_affinity."""
  env = r.get("env", {})
  if "cpu_affinity" not in env:
    return None
  return cpus.narrowing_note(env["cpu_affinity"], env["cpu_count"], r.get("launcher"),
                             env.get("cpu_binding"))


def host_cell(r: dict) -> str:
  """The host column: shared or packed, and the CPUs where a launcher narrowed them."""
  env = r.get("env", {})
  narrowed = (f"{cpus.count(env['cpu_affinity'])} of {env['cpu_count']} CPUs"
              if cpus_note(r) else None)
  return ", ".join(filter(None, (sharing(r), narrowed)))


def sharing_notes(ok: list) -> list:
  """A footnote per mark the ok runs carry, naming the runs, and the line of each run
  whose CPUs were narrowed."""
  marked = group([r for r in ok if sharing(r)], sharing)
  return [f"{mark}: {note} (run(s) {', '.join(r['run_id'] for r in marked[mark])})."
          for mark, note in SHARING_NOTES.items() if mark in marked] + [
              f"run {r['run_id']}: {cpus_note(r)}." for r in ok if cpus_note(r)]


ARRAYS_HEADING = "Slurm job arrays"


def array_lines(records: list) -> list:
  """Per Slurm job array the records ran in, each task's runs by status:
  'array 14: task 0: 2 ok, 1 interrupted; task 1: 1 ok'. [] where none did."""
  in_arrays = [r for r in records if r.get("array_job_id")]
  lines = []
  for job, runs in group(in_arrays, lambda r: r["array_job_id"]).items():
    by_task = group(sorted(runs, key=lambda r: (r.get("array_task_id") is None,
                                                r.get("array_task_id") or 0)),
                    lambda r: r.get("array_task_id"))
    lines.append(f"array {job}: " + "; ".join(
        f"task {'?' if task is None else task}: {status_counts(mine)}"
        for task, mine in by_task.items()))
  return lines


PEAKS_WIDTH = 100  # columns the peak footer wraps at


def peak_lines(records: list) -> list:
  """The peaks records' MFU is against, each distinct one once: one bullet per probe
  or table entry (peak.source_kind: what was measured, where, shared by how many
  devices), the per-device range its runs got and which runs used it, wrapped for a
  terminal. Each record's peak_source keeps the whole text."""
  lines = []
  for kind, runs in sorted(group(records, lambda r: peak_lib.source_kind(
      r["peak_source"])).items()):
    values = [r["peak_flops_per_device"] for r in runs if r["peak_flops_per_device"]]
    low, high = ((peak_lib.flops_label(min(values)), peak_lib.flops_label(max(values)))
                 if values else (None, None))
    if not values:
      got = "no peak"
    elif low == high:
      got = f"{low}/device"
    else:  # '59.8–93.4 GFLOP/s' where both have the same unit
      unit = high.split(" ")[1]
      got = f"{low.split(' ')[0] if low.endswith(unit) else low}–{high}/device"
    who = ", ".join(f"{system} {model} {mesh}" + (f" ×{len(same)}" if len(same) > 1 else "")
                    for (system, model, mesh), same in group(
                        runs, lambda r: (r["system"], r["model"], r["mesh_shape"])).items())
    lines.append(textwrap.fill(f"- {kind}: {got}; {len(runs)} run(s): {who}",
                               PEAKS_WIDTH, subsequent_indent="    ",
                               break_on_hyphens=False))
  return lines


# --------------------------------------------------------------------------------
# Grouping and spread, shared by report.md, the plots and --compare.

def row_key(r: dict) -> tuple:
  """One row of the Table-1 table: the configuration, run the same way (processes,
  strategy and launcher: a multi-process run of a system is not its local run, nor
  one under srun one under torchrun)."""
  return config_key(r) + (r["num_processes"], r["strategy"], r.get("launcher"))


def train_key(r: dict) -> tuple:
  """What makes two train records the same configuration on the same system."""
  return row_key(r) + (r["system"],)


# The record fields train_key's values come from, in its order.
TRAIN_KEY_FIELDS = CONFIG_KEYS + ("num_processes", "strategy", "launcher", "system")


def launched_as(r: dict, field: str) -> str:
  """A record's `field` (its process count, its strategy) with the launcher that
  started it, where one did: "2 (slurm)"."""
  launcher = r.get("launcher")
  return f"{r[field]}" + (f" ({launcher})" if launcher else "")


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


def micro_key(r: dict) -> tuple:
  return (r["system"], r["mode"], r["hosts"], r["devices_per_host"], r["chain_length"],
          r["computations"], r["matmul_n"])


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


# --------------------------------------------------------------------------------
# report.md tables.

def markdown(header: list, rows: list) -> str:
  def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
  lines = ["| " + " | ".join(map(cell, header)) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
  return "\n".join(lines)


def systems_in(records: list) -> list:
  """System names, the baseline first."""
  names = sorted({r["system"] for r in records})
  return sorted(names, key=lambda s: s != BASELINE_SYSTEM)


# A published figure's MFU is derived here, not published: the label says so.
IMPLIED_MFU = "implied MFU (derived)"


def percent(fraction: float) -> str:
  return f"{100 * fraction:.1f}%"


def baseline_system(records: list) -> str:
  """The system ratios divide by: BASELINE_SYSTEM where the records have it, else the
  first name."""
  names = systems_in(records)
  return names[0] if names else BASELINE_SYSTEM


PUBLISHED_TOKENS = "published JAX / Pathways tokens/s (TPUv3 cores)"


def table1(records: list) -> tuple:
  """(header, rows): one row per configuration and system, baseline first, so that
  another system adds rows, not columns: its tokens/s with spread, median step time,
  MFU and runs, its ratio to the baseline system's tokens/s on the same configuration
  (baseline_system), then the configuration's published figures and the MFU they
  imply on TPUv3 (published.implied_mfu; Pathways' figure, which Table 1's JAX figure
  equals)."""
  names, baseline = systems_in(records), baseline_system(records)
  header = ["model", "params", "dtype", "devices", "mesh", "strategy", "batch", "system",
            "runs", "tokens/s [spread]", "step median (s)", "MFU", f"vs {baseline}",
            "startup (s): build + warmup", PUBLISHED_TOKENS, IMPLIED_MFU]
  rows = []
  for runs in group(records, row_key).values():
    first = runs[0]
    config = [first["model"], f"{first['num_params'] / 1e6:,.1f}M", dtype_label(first),
              str(first["num_devices"]), first["mesh_shape"], launched_as(first, "strategy"),
              str(first["global_batch"])]
    pub = published.table_row(first)
    pub_cells = ([f"{f'{pub[2]:,}' if pub[2] else '–'} / {pub[3]:,} ({pub[1]})",
                  percent(published.implied_mfu(first["model"], pub[3], pub[1]))] if pub
                 else ["–", "–"])
    ok_of = {s: [r for r in runs if r["system"] == s and r["status"] == "ok"]
             for s in names}
    base = tokens_band(ok_of[baseline])[0] if ok_of[baseline] else None
    for s in names:
      ok, partial = ok_of[s], partial_runs([r for r in runs if r["system"] == s])
      if not ok and not partial:
        continue  # not run on this configuration: no row
      if not ok:
        rows.append(config + [s, f"0 ({status_counts(partial)})", NO_OK_RUN, "–", "–",
                              "–", "–"] + pub_cells)
        continue
      marks = collections.Counter(sharing(r) for r in ok if sharing(r))
      notes = [f"{marks[m]} {m}" for m in SHARING_NOTES if marks[m]]
      notes += [f"+{status_counts(partial)}"] if partial else []  # not counted
      count = f"{len(ok)}" + (f" ({', '.join(notes)})" if notes else "")
      median, low, high = tokens_band(ok)
      mfus = [r["mfu"] for r in ok if r["mfu"] is not None]
      steps = [r["step_time_s"]["median"] for r in ok]
      started = [r for r in ok if startup_s(r) is not None]
      rows.append(config + [
          s, count, f"{median:,.0f} [{_si(low)}–{_si(high)}]",
          f"{statistics.median(steps):.3f}",
          f"{100 * statistics.median(mfus):.1f}%" if mfus else "–",
          f"{median / base:.2f}x" if base else "–",
          startup_cell(statistics.median(r["build_s"] for r in started),
                       statistics.median(r["warmup_s"] for r in started),
                       _cache_outcome(started))
          if started else "–"] + pub_cells)
  return header, rows


def micro_table(records: list) -> tuple:
  """(header, rows): Fig. 5 as numbers, one row per host count, one column per
  system x mode: median computations/s [repeats' min–max]."""
  order = list(micro.SYSTEMS)  # tf (the single controller) first
  columns = sorted({(r["system"], r["mode"]) for r in records},
                   key=lambda c: (order.index(c[0]) if c[0] in order else len(order), c[0],
                                  micro.MODES.index(c[1]) if c[1] in micro.MODES else 9))
  by_hosts = group(sorted(records, key=lambda r: (r["hosts"], r["devices_per_host"])),
                   lambda r: (r["hosts"], r["devices_per_host"]))
  rows = []
  for (hosts, per_host), runs in by_hosts.items():
    row = [str(hosts), str(hosts * per_host)]
    for system, mode in columns:
      mine = [r for r in runs if (r["system"], r["mode"]) == (system, mode)]
      ok = [r for r in mine if r["status"] == "ok"]
      if ok:
        median, low, high = rate_band(ok)
        row.append(f"{median:,.0f} [{_si(low)}–{_si(high)}]")
      else:
        row.append(mine[-1]["status"].replace("_", " ") if mine else "not run")
    rows.append(row)
  return ["hosts", "devices"] + [f"{s} {m}" for s, m in columns], rows


def crossover_table(records: list) -> tuple:
  """(header, rows): Fig. 6 as numbers, one row per host count x matmul, with the
  duration asked for and the one measured here (small matmuls run below the
  calibrated rate, so the measured one is the x axis that holds), each system's
  median opbyop computations/s and every other system's share of JAX's."""
  order = list(micro.SYSTEMS)
  names = sorted({r["system"] for r in records},
                 key=lambda s: (order.index(s) if s in order else len(order), s))
  groups = group(sorted(records, key=lambda r: (r["hosts"], r["devices_per_host"],
                                                r["computation_ms"] or 0, r["matmul_n"])),
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
      mine = [r for r in runs if r["system"] == s]
      if ok:
        medians[s] = rate_band(ok)[0]
      row.append(f"{medians[s]:,.0f}" if ok else
                 mine[-1]["status"].replace("_", " ") if mine else "not run")
    row += [f"{100 * medians[s] / medians['jax']:.0f}%"
            if s in medians and medians.get("jax") else "–"
            for s in names if s != "jax"]
    rows.append(row)
  header = ["hosts", "devices", "ms asked", "ms measured", "matmul n"]
  header += [f"{s} computations/s" for s in names]
  header += [f"{s}/jax" for s in names if s != "jax"]
  return header, rows


# --------------------------------------------------------------------------------
# results.csv: every record, train and micro, one row each.

# Nested fields flattened (step_time_s -> step_time_<stat>_s, env -> env_<key>);
# lists and the flags as JSON text; the multi-line gin `config` is left to the JSONL.
CSV_SKIPPED = ("config",)


def env_columns() -> list:
  """env_<key> for what every record's env holds and every registered system's
  library versions (tf_tput.systems.distributions)."""
  python, *rest = results.ENV_KEYS
  return [f"env_{k}" for k in (python, *systems.distributions(), *rest, "cpu_count")]


def csv_columns() -> list:
  columns, fields = ["schema"], dict.fromkeys([*results.FIELDS, *results.MICRO_FIELDS])
  for name in fields:
    if name == "step_time_s":
      columns += [f"step_time_{k}_s" for k in results.STEP_TIME_KEYS]
    elif name == "env":
      columns += env_columns()
    elif name not in columns and name not in CSV_SKIPPED:
      columns.append(name)
  return columns


def csv_row(r: dict) -> dict:
  row, env_keys = {}, env_columns()
  for name, value in r.items():
    if name in CSV_SKIPPED:
      continue
    if name == "step_time_s":
      row.update({f"step_time_{k}_s": v for k, v in value.items()})
    elif name == "env":
      row.update({f"env_{k}": json.dumps(v) if isinstance(v, (list, dict)) else v
                  for k, v in value.items() if f"env_{k}" in env_keys})
    elif isinstance(value, (list, dict)):
      row[name] = json.dumps(value)
    else:
      row[name] = value
  return row


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
  names = systems_in(decoders)
  header = ["model", "dtype", "devices", "batch x length", "partitioning", "bubble"]
  for s in names:
    header += [f"{s} tokens/s [spread]", f"{s} vs SPMD"]
  header += ["published Pathways tokens/s (TPUv3 cores)", "published vs SPMD"]
  by_group = group(decoders, lambda r: (r["model"], r["dtype"], r["num_devices"],
                                        r["global_batch"], r["targets_length"]))
  rows = []
  published_spmd = published.TABLE2_DECODER_3B[0][4]
  for runs in by_group.values():
    medians = {}  # (partitioning, system) -> median tokens/s
    for key, mine in group(runs, lambda r: (_partitioning(r), r["system"])).items():
      ok = [r for r in mine if r["status"] == "ok"]
      if ok:
        medians[key] = tokens_band(ok)
    spmd = {}  # per system its fastest SPMD row: what a pipeline has to beat
    for (part, s), band in medians.items():
      if part.startswith("SPMD"):
        spmd[s] = max(spmd.get(s, 0), band[0])
    for part, mine in group(runs, _partitioning).items():
      first = mine[0]
      row = [first["model"], first["dtype"], str(first["num_devices"]),
             f"{first['global_batch']} x {first['targets_length']}", part,
             f"{first.get('bubble_fraction') or 0:.3f}"]
      for s in names:
        band = medians.get((part, s))
        tried = any(r["system"] == s for r in mine)
        row += ([f"{band[0]:,.0f} [{_si(band[1])}–{_si(band[2])}]",
                 f"{band[0] / spmd[s]:.2f}x" if s in spmd else "–"] if band
                else [NO_OK_RUN if tried else "not run", "–"])
      pub = published.table_row(first)
      row += ([f"{pub[3]:,} ({pub[1]})", f"{pub[3] / published_spmd:.2f}x"] if pub
              else ["–", "–"])
      rows.append(row)
  return header, rows


def islands_table(records: list) -> tuple:
  """(header, rows): §5.3 as numbers. Runs under tf_tput.launch --islands grouped by model,
  devices, processes, global batch and length; one row per islands x link rate, per
  system its tokens/s and fraction of its one-island row, the link bytes per step,
  counted and analytic (each system's reduction sends its own), and the fraction an
  ideal link with no overlap would give (the unshaped islands run's step time plus the
  link's bytes at its rate: dcn.py's model at efficiency 1, overlap 0); and the paper's
  fraction for its models."""
  launched = [r for r in records if r.get("islands", 0) >= 1]  # under --islands=K
  names = systems_in(launched)
  header = ["model", "pipeline", "devices", "processes", "islands x devices", "link rate"]
  for s in names:
    header += [f"{s} tokens/s [spread]", f"{s} of 1 island",
               f"{s} link bytes/step (counted)", f"{s} link bytes/step (analytic)",
               f"{s} ideal-link projection"]
  header += ["published fraction"]
  rows = []
  place = lambda r: (r["islands"], r.get("dcn_rate") or "loopback")
  for runs in group(launched, lambda r: (r["model"], _pipeline(r), r["num_devices"],
                                         r["num_processes"], r["global_batch"],
                                         r["targets_length"])).values():
    medians = {}
    for (where, s), mine in group(runs, lambda r: (place(r), r["system"])).items():
      ok = [r for r in mine if r["status"] == "ok"]
      if ok:
        medians[(where, s)] = (tokens_band(ok), ok[-1])
    for where, mine in group(runs, place).items():
      first = mine[0]
      row = [first["model"], _pipeline(first), str(first["num_devices"]),
             str(first["num_processes"]),
             f"{first['islands']} x {first['devices_per_island']}", where[1]]
      for s in names:
        got, one = medians.get((where, s)), medians.get(((1, "loopback"), s))
        if not got:
          row += ["–"] * 5
          continue
        last = got[1]
        counted, analytic = (last.get("link_bytes_per_step"),
                             last.get("link_bytes_per_step_analytic"))
        row += [f"{got[0][0]:,.0f} [{_si(got[0][1])}–{_si(got[0][2])}]",
                f"{got[0][0] / one[0][0]:.3f}" if one else "–",
                f"{counted:,.0f}" if counted else "–",
                f"{analytic:,.0f}" if analytic else "–",
                _ideal_link_fraction(last, medians)]
      rows.append(row + [_published_fraction(first)])
  return header, rows


def _pipeline(r: dict) -> str:
  """'S x M' for a pipelined run (its stages split across the islands), else '–'."""
  stages = r.get("pipeline_stages") or 1
  return f"{stages} x {r['micro_batches']}" if stages > 1 else "–"


def _ideal_link_fraction(r: dict, medians: dict) -> str:
  """Step time on an unshaped link plus the bytes one island sends at the rate."""
  from tf_tput.runtime import islands
  rate = islands.parse_rate(r["dcn_rate"]) if r.get("dcn_rate") else None
  base = medians.get(((r["islands"], islands.NO_LIMIT), r["system"]))
  one = medians.get(((1, "loopback"), r["system"]))
  if not rate or not base or not one or not r.get("link_bytes_per_step"):
    return "–"
  base_s = base[1]["step_time_s"]["median"]
  transfer_s = r["link_bytes_per_step"] / r["islands"] * 8 / rate
  one_s = one[1]["step_time_s"]["median"]
  return f"{one_s / (base_s + transfer_s):.3f}"


def _published_fraction(r: dict) -> str:
  if (r.get("pipeline_stages") or 1) > 1:
    pub = published.MULTI_ISLAND_PIPELINE.get(r["model"])
    return (f"{pub[4]:g} (S={pub[0]}, M={pub[1]}, {pub[2]} x {pub[3]})" if pub
            else "–")
  pub = published.MULTI_ISLAND.get(r["model"])
  return f"{pub[3]:g} ({pub[0]} x {pub[1]})" if pub else "–"
