"""Appending runs and pre-flight checks of other runs, racing on a results file that
does not exist yet: every record appended is found (results.check_appendable never
creates or removes the file; results.append never renames or truncates it)."""

import multiprocessing

from tf_tput.records import results

from record_fixtures import train_record

TRIALS, WRITERS, CHECKERS, RECORDS, CHECKS = 40, 2, 2, 3, 20


def _write(path, barrier, writer):
  results.check_appendable(path)  # a run checks first (making the directory), then runs
  barrier.wait()
  for i in range(RECORDS):
    results.append(path, train_record(run_id=f"w{writer}-{i}"))


def _check(path, barrier):
  barrier.wait()
  for _ in range(CHECKS):
    results.check_appendable(path)


def test_checks_racing_appends_to_a_new_file_lose_no_record(tmp_path):
  context = multiprocessing.get_context("fork")  # the children start in milliseconds
  lost, crashed = [], []
  for trial in range(TRIALS):
    path = str(tmp_path / f"trial{trial}" / "runs.jsonl")  # neither file nor directory yet
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
  assert (sum(lost), sum(crashed)) == (0, 0), (
      f"of {TRIALS} trials, {sum(n > 0 for n in lost)} lost {sum(lost)} records and "
      f"{sum(n > 0 for n in crashed)} had {sum(crashed)} processes crash")
