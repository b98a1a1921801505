"""Appending runs and pre-flight checks of other runs, racing on a results file that
does not exist yet: every record appended is found (results.check_appendable never
creates or removes the file; results.append never renames or truncates it).

The race runs in a fresh interpreter (this file as a script): it forks its writers and
checkers, which is safe only in a process without threads, and a test process has
them (xdist's, frameworks')."""

import json
import multiprocessing
import pathlib
import subprocess
import sys

TRIALS, WRITERS, CHECKERS, RECORDS, CHECKS = 40, 2, 2, 3, 20


def _write(path, barrier, writer):
  from tf_tput.records import results
  from record_fixtures import train_record
  results.check_appendable(path)  # a run checks first (making the directory), then runs
  barrier.wait()
  for i in range(RECORDS):
    results.append(path, train_record(run_id=f"w{writer}-{i}"))


def _check(path, barrier):
  from tf_tput.records import results
  barrier.wait()
  for _ in range(CHECKS):
    results.check_appendable(path)


def race(directory: pathlib.Path) -> dict:
  """{lost: records lost per trial, crashed: processes that failed per trial}."""
  from tf_tput.records import results
  context = multiprocessing.get_context("fork")  # the children start in milliseconds
  lost, crashed = [], []
  for trial in range(TRIALS):
    path = str(directory / f"trial{trial}" / "runs.jsonl")  # neither file nor directory
    # A child that crashes before the barrier breaks it for the others (after 10 s).
    barrier = context.Barrier(WRITERS + CHECKERS, timeout=10)
    procs = ([context.Process(target=_write, args=(path, barrier, w)) for w in range(WRITERS)]
             + [context.Process(target=_check, args=(path, barrier))
                for _ in range(CHECKERS)])
    for p in procs:
      p.start()
    for p in procs:
      p.join(timeout=60)
      if p.exitcode is None:
        p.kill()  # leave no child behind, whatever happened
        p.join()
    crashed.append(sum(p.exitcode != 0 for p in procs))
    records, problems = results.read(path)
    assert problems == []
    lost.append(WRITERS * RECORDS - len(records))
  return {"lost": lost, "crashed": crashed}


def test_checks_racing_appends_to_a_new_file_lose_no_record(tmp_path):
  child = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
  assert child.returncode == 0, child.stderr[-3000:]
  outcome = json.loads(child.stdout)
  lost, crashed = outcome["lost"], outcome["crashed"]
  assert (sum(lost), sum(crashed)) == (0, 0), (
      f"of {TRIALS} trials, {sum(n > 0 for n in lost)} lost {sum(lost)} records and "
      f"{sum(n > 0 for n in crashed)} had {sum(crashed)} processes crash")


if __name__ == "__main__":
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # record_fixtures
  print(json.dumps(race(pathlib.Path(sys.argv[1]))))
