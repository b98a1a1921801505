"""Result files -> a throughput table on the console.

    python -m tf_tput.report --results=results/bench.jsonl[,more.jsonl]

Malformed lines are reported with their line numbers and skipped; the rest is read.
"""

import sys

from absl import app
from absl import flags

from tf_tput import results

FLAGS = flags.FLAGS
flags.DEFINE_list("results", ["results/runs.jsonl"], "Comma-separated result files.")

BASELINE_SYSTEM = "mtf"
COLUMNS = ("model", "system", "dtype", "mesh", "dev", "proc", "tokens/s",
           f"vs {BASELINE_SYSTEM}", "step p10 / median / p90 (s)", "MFU", "MFU@best",
           "final loss", "status")
# Records that differ only in their system are the same configuration.
CONFIG_KEYS = ("model", "dtype", "mesh_shape", "layout", "num_devices", "global_batch",
               "inputs_length", "targets_length")


def _config(r: dict) -> tuple:
  return tuple(r[k] for k in CONFIG_KEYS)


def _ratio(r: dict, baselines: dict) -> str:
  base = baselines.get(_config(r))
  if not base or not r["tokens_per_sec"]:
    return "-"
  return f"{r['tokens_per_sec'] / base:.2f}x"


def _hardware(r: dict) -> tuple:
  return (r["env"]["cpu"], str(r["env"]["accelerators"]), r["dtype"])


def best_peaks(records: list) -> dict:
  """Per hardware and dtype, the highest whole-machine peak any record measured.

  Each system's MFU is against its own framework's matmul peak; MFU@best puts every
  system on the same machine and dtype against one peak, the best either reached.
  """
  best = {}
  for r in records:
    if r["peak_flops_per_device"]:
      whole = r["peak_flops_per_device"] * r["num_devices"]
      best[_hardware(r)] = max(best.get(_hardware(r), 0), whole)
  return best


def _mfu_at_best(r: dict, peaks: dict) -> str:
  peak = peaks.get(_hardware(r))
  if not peak or not r["model_tflops_per_sec"]:
    return "-"
  return f"{100 * r['model_tflops_per_sec'] * 1e12 / peak:.1f}%"


def _row(r: dict, baselines: dict, peaks: dict) -> tuple:
  st = r["step_time_s"]
  spread = ("-" if st["median"] is None else
            f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}")
  return (r["model"], r["system"], r["dtype"], r["mesh_shape"], str(r["num_devices"]),
          str(r["num_processes"]),
          "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:,.0f}",
          _ratio(r, baselines), spread,
          "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%", _mfu_at_best(r, peaks),
          "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}",
          r["status"] if r["status"] == "ok" else f"failed: {r['error'][:60]}")


def format_table(records: list) -> str:
  """One row per record; "vs mtf" is tokens/s over the baseline's on the same config
  (its latest ok record)."""
  baselines = {_config(r): r["tokens_per_sec"] for r in records
               if r["system"] == BASELINE_SYSTEM and r["status"] == "ok"}
  peaks = best_peaks(records)
  rows = [COLUMNS] + [_row(r, baselines, peaks) for r in records]
  widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
           for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def main(argv) -> int:
  del argv
  records = []
  for path in FLAGS.results:
    found, problems = results.read(path, schema=results.SCHEMA)
    for number, problem in problems:
      print(f"warning: {path}:{number}: {problem}; skipped", file=sys.stderr)
    records += found
  if not records:
    print(f"error: no result records in {','.join(FLAGS.results)}; run "
          "python -m tf_tput.train first", file=sys.stderr)
    return 1
  print(format_table(records))
  peaks = sorted({r["peak_source"] for r in records})
  print("\nMFU peak: " + "; ".join(peaks))
  print("tokens/s counts non-padding tokens over measured steps (warmup excluded); "
        "MFU = model FLOP/s (3 x forward matmuls) / the run's own peak; MFU@best uses "
        "the best peak measured on the same hardware and dtype in these files.")
  return 0


if __name__ == "__main__":
  app.run(main)
