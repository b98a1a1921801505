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
           f"vs {BASELINE_SYSTEM}", "step p10 / median / p90 (s)", "MFU", "final loss",
           "status")
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


def _row(r: dict, baselines: dict) -> tuple:
  st = r["step_time_s"]
  spread = ("-" if st["median"] is None else
            f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}")
  return (r["model"], r["system"], r["dtype"], r["mesh_shape"], str(r["num_devices"]),
          str(r["num_processes"]),
          "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:,.0f}",
          _ratio(r, baselines), spread,
          "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
          "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}",
          r["status"] if r["status"] == "ok" else f"failed: {r['error'][:60]}")


def format_table(records: list) -> str:
  """One row per record; "vs mtf" is tokens/s over the baseline's on the same config
  (its latest ok record)."""
  baselines = {_config(r): r["tokens_per_sec"] for r in records
               if r["system"] == BASELINE_SYSTEM and r["status"] == "ok"}
  rows = [COLUMNS] + [_row(r, baselines) for r in records]
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
        "MFU = model FLOP/s (3 x forward matmuls) / peak.")
  return 0


if __name__ == "__main__":
  app.run(main)
