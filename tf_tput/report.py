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

COLUMNS = ("model", "system", "dtype", "mesh", "dev", "tokens/s", "step p10 / median / "
           "p90 (s)", "MFU", "final loss", "status")


def _row(r: dict) -> tuple:
  st = r["step_time_s"]
  spread = ("-" if st["median"] is None else
            f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}")
  return (r["model"], r["system"], r["dtype"], r["mesh_shape"], str(r["num_devices"]),
          "-" if r["tokens_per_sec"] is None else f"{r['tokens_per_sec']:,.0f}",
          spread, "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
          "-" if r["final_loss"] is None else f"{r['final_loss']:.3f}",
          r["status"] if r["status"] == "ok" else f"failed: {r['error'][:60]}")


def format_table(records: list) -> str:
  rows = [COLUMNS] + [_row(r) for r in records]
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
