"""Result files -> a console table, or a report directory, or a comparison.

    python -m tf_tput.report --results=results/bench.jsonl[,more.jsonl]
    python -m tf_tput.report --results=a.jsonl,b.jsonl --out=reports/today
    python -m tf_tput.report --compare=old.jsonl --against=new.jsonl

--out writes report.md (tables, plots, published figures, conventions, versions and
hardware), results.csv (every record) and PNG plots. Malformed lines are reported
with their line numbers and skipped; the rest is read.
"""

import csv
import dataclasses
import os
import sys
from typing import Optional

from absl import flags

from tf_tput import entry, errors
from tf_tput.records import results
from tf_tput.errors import UsageError
from tf_tput.report import compare as compare_lib
from tf_tput.report import configs, console, csv_rows, document

FLAGS = flags.FLAGS
flags.DEFINE_list("results", ["results/runs.jsonl"], "Comma-separated result files "
                  "(training and micro-benchmark records).")
flags.DEFINE_string("out", None, "Write report.md, results.csv and PNG plots into this "
                    "directory (created). Without it, print tables on the console.")
flags.DEFINE_string("compare", None, "Old result file; with --against, compare "
                    "each configuration they share.")
flags.DEFINE_string("against", None, "New result file compared with --compare.")


@dataclasses.dataclass(frozen=True)
class ReportRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  results: tuple
  out: Optional[str]
  compare: Optional[str]
  against: Optional[str]
  results_given: bool  # --results named, not left at its default: refused by --compare


# Plot name -> file written into --out.
PLOT_FILES = {"tokens_per_sec": "tokens_per_sec.png", "step_times": "step_times.png",
              "fig5": "fig5_dispatch.png"}


def _read(paths: list, flag: str) -> tuple:
  """(train records, micro records, sources, problems) of every file. A record whose
  run_id was read before (a file named twice, records copied between files) is
  dropped, so no run counts twice; sources say how many: (path, train, micro,
  dropped). A train record run in a variant of its system is reported as a system of
  its own (configs.variant_as_system)."""
  train, micro, sources, problems, seen = [], [], [], [], set()
  for path in paths:
    if not os.path.isfile(path):
      raise UsageError(f"{flag}: {path} is not a file; pass result files written by "
                       "tf_tput.train / tf_tput.micro / tf_tput.suite")
    found, bad = results.read(path)
    for number, problem in bad:
      print(f"warning: {path}:{number}: {problem}; skipped", file=sys.stderr)
      problems.append((path, number, problem))
    new = [r for r in found if r["run_id"] not in seen]
    seen.update(r["run_id"] for r in found)
    dropped = len(found) - len(new)
    if dropped:
      print(f"warning: {path}: dropped {dropped} record(s) whose run_id was already "
            "read (the same run counts once)", file=sys.stderr)
    t = [configs.variant_as_system(r) for r in new if r["schema"] == results.SCHEMA]
    m = [r for r in new if r["schema"] == results.MICRO_SCHEMA]
    train, micro = train + t, micro + m
    sources.append((path, len(t), len(m), dropped))
  return train, micro, sources, problems


def write_report(out: str, train: list, micro: list, sources: list, problems: list) -> list:
  """Writes the report directory; returns the paths written."""
  from tf_tput.report import plots  # matplotlib only when plots are drawn
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise UsageError(f"--out={out} cannot be created ({e.strerror}); choose another "
                     "directory") from None
  written = {}
  drawers = {"tokens_per_sec": (plots.tokens_per_sec, train),
             "step_times": (plots.step_times, train), "fig5": (plots.fig5, micro)}
  for name, (draw, records) in drawers.items():
    if records and draw(records, os.path.join(out, PLOT_FILES[name])):
      written[name] = PLOT_FILES[name]
  csv_path = os.path.join(out, "results.csv")
  with open(csv_path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=csv_rows.csv_columns())
    writer.writeheader()
    for r in train + micro:
      writer.writerow(csv_rows.csv_row(r))
  md_path = os.path.join(out, "report.md")
  with open(md_path, "w") as f:
    f.write(document.render(train, micro, sources, problems, written))
  return [md_path, csv_path] + [os.path.join(out, f) for f in written.values()]


def _compare(request: ReportRequest) -> int:
  if not (request.compare and request.against):
    raise UsageError("--compare and --against go together: --compare=old.jsonl "
                     "--against=new.jsonl")
  if request.results_given or request.out:
    raise UsageError("--compare/--against print a comparison; drop --results / --out "
                     "(or run the report separately)")
  old = _read([request.compare], "--compare")
  new = _read([request.against], "--against")
  header, rows, notes = compare_lib.compare(old[0] + old[1], new[0] + new[1])
  # Files that share nothing still answer the question: which configurations each has.
  print(console.aligned(header, rows) if rows else compare_lib.NONE_SHARED)
  for note in notes:
    print(note)
  if rows:
    print(compare_lib.legend())
  return 0


def run(request: ReportRequest) -> int:
  if request.compare or request.against:
    return _compare(request)
  train, micro, sources, problems = _read(request.results, "--results")
  if not train and not micro:
    print(f"error: no result records in {','.join(request.results)}; run "
          "python -m tf_tput.train first", file=sys.stderr)
    return 1
  if request.out is None:
    print(console.render(train, micro))
    return 0
  for path in write_report(request.out, train, micro, sources, problems):
    print(f"wrote {path}")
  return 0


def main(argv) -> int:
  request = ReportRequest(results=tuple(FLAGS.results), out=FLAGS.out,
                          compare=FLAGS.compare, against=FLAGS.against,
                          results_given=bool(FLAGS["results"].present))
  return errors.run_entry_point(lambda: run(request), argv)


if __name__ == "__main__":
  entry.start(main)
