"""Runs a suite: a gin-defined matrix of runs, each in its own process, resumable.

    python -m tf_tput.suite --suite=table1_local --results=results/table1_local.jsonl
    python -m tf_tput.suite --suite=table1_paper --dry_run

Every run is `python -m tf_tput.train ...` or `python -m tf_tput.micro ...` in a
child process (a crash, a leak or a hung framework cannot affect the next run), its
output in a log file. A run whose key (tf_tput/records/keys.py) already has a
finished record in --results is skipped, so rerunning the same command resumes. A run
that fails is said on the console and in the summary, and the suite goes on; Ctrl-C
(or SIGTERM, SIGHUP) stops the running child, which records what it measured as
interrupted, and the suite, keeping every record written so far; a resume reruns the
interrupted run.
"""

import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import Optional

from absl import flags

from tf_tput import REPO_ROOT, entry, errors, systems
from tf_tput.records import build, results
from tf_tput.runtime import launchers, processes, topology
from tf_tput import suite as suites
from tf_tput.suite import shares
from tf_tput.errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_string("suite", None, "A suite of gin/suites/ by name, e.g. "
                    "table1_local, or a suite file's path.")
flags.DEFINE_string("results", None, "JSON-lines file the runs append to, and that "
                    "tells which runs already succeeded. Default results/<suite name>.jsonl.")
flags.DEFINE_string("logs_dir", None, "One log file per run (the child's output). "
                    "Default: beside --results, <results without .jsonl>.logs/.")
flags.DEFINE_bool("dry_run", False, "Validate every run as tf_tput.train would and "
                  "print what it would run (params, devices, tokens/step, state per "
                  "device); run nothing.")
flags.DEFINE_float("run_timeout_s", 3 * 3600, "Stop a run that takes longer than this.")
flags.DEFINE_multi_string("train_flag", [], "A tf_tput.train flag for every train run "
                          "that does not change what it measures, repeatable, e.g. "
                          "--train_flag=--tpu=local.")
flags.DEFINE_enum("launcher", suites.LAUNCHERS[0], suites.LAUNCHERS, "How train runs "
                  "start: tf_tput.launch on this machine (runs of several processes or "
                  "workers), or srun: each run a job step of the Slurm job the suite "
                  "runs in, its processes (or its chief and workers) the step's tasks "
                  "(scripts/slurm/suite.sbatch; docs/clusters.md).")
flags.DEFINE_enum("share", shares.SHARES[0], shares.SHARES, "Which of the suite's runs "
                  "this process runs: all, or slurm_array: this Slurm array task's "
                  "share, every Nth run from its index in an array of N tasks "
                  "(scripts/slurm/suite.sbatch passes it under sbatch --array). In an "
                  "array job every task claims its runs first (a claims directory "
                  "beside --results), and a run another live task holds is refused.")
flags.DEFINE_float("grace_s", 10, "After SIGTERM, seconds a stopped run gets before SIGKILL.")


@dataclasses.dataclass(frozen=True)
class SuiteRequest:
  """What the flags ask of the suite, read once in main(); the flags above hold each
  one's default and help."""
  suite: Optional[str]
  results: Optional[str]
  logs_dir: Optional[str]
  dry_run: bool
  run_timeout_s: float
  train_flag: tuple
  launcher: str
  share: str
  grace_s: float


LOG_TAIL_LINES = 5


def _duration(seconds: float) -> str:
  seconds = round(seconds)
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def time_left(remaining: list, durations: dict) -> str:
  """Estimate for the runs left: the mean duration of finished runs of the same group
  (model, or micro system and hosts), else of all finished runs."""
  finished = [d for ds in durations.values() for d in ds]
  if not remaining:
    return "none left"
  if not finished:
    return "time left unknown until a run finishes"
  overall = sum(finished) / len(finished)
  guessed = sum(1 for run in remaining if run.group not in durations)
  total = sum(sum(durations[run.group]) / len(durations[run.group])
              if run.group in durations else overall for run in remaining)
  note = f" ({guessed} of them guessed from the mean of others)" if guessed else ""
  return f"~{_duration(total)} left for {len(remaining)} run(s){note}"


class _Terminated(Exception):
  """SIGTERM or SIGHUP to the suite: stop the child as for Ctrl-C."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _on_signal(signum, frame):
  del frame
  raise _Terminated(signum)


def _execute(run: suites.Run, results_path: str, log_path: pathlib.Path,
             request: SuiteRequest) -> str:
  """Runs one child; returns how it ended ("exit code 0", "timed out after ...")."""
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  env[processes.RUN_ID_ENV] = build.new_run_id()  # the run's processes share it
  command = run.command(results_path, request.train_flag, request.launcher)
  with open(log_path, "wb") as log:
    log.write((processes.COMMAND_PREFIX + " ".join(command) + "\n").encode())
    log.flush()
    # Its own session: Ctrl-C reaches the suite only, which stops the child's group;
    # if the suite is killed outright, the child is killed too (processes.popen).
    child = processes.popen(command, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    try:
      code = child.wait(timeout=request.run_timeout_s)
    except subprocess.TimeoutExpired:
      return f"timed out after --run_timeout_s={request.run_timeout_s:g}"
    finally:
      processes.stop([child], request.grace_s)  # also on Ctrl-C; no orphans
  return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _outcome(ending: str, new_records: list, log_path) -> tuple:
  """(status word, one-line description) of a finished run."""
  if not new_records:
    tail = processes.log_tail(log_path, LOG_TAIL_LINES, "(empty log)", _startup_noise())
    return "died", f"{ending}, no record written; log {log_path}: {tail}"
  record = new_records[-1]
  if record["status"] in ("failed", "interrupted"):
    return record["status"], f"{record['status']} ({ending}), recorded: {record['error']}"
  if record["schema"] == results.SCHEMA:
    return record["status"], f"ok, {record['tokens_per_sec']:,.0f} tokens/s"
  if record["status"] == "ok":
    return "ok", f"ok, {record['computations_per_sec']:,.0f} computations/s"
  return record["status"], f"{record['status']}: {record['error']}"


def _startup_noise() -> tuple:
  """Every registered runtime's startup_noise: a run's log holds what each framework
  it loaded printed, and a run may load another system's framework (tfds, say)."""
  return tuple(dict.fromkeys(pattern for name in systems.REGISTRY
                             for pattern in systems.load(name).runtime.startup_noise))


def _default_results(suite, request: SuiteRequest) -> str:
  return request.results or os.path.join("results", f"{suite.name}.jsonl")


def dry_run(runs: list) -> int:
  for index, run in enumerate(runs, start=1):
    print(f"[{index}/{len(runs)}] {run.label}: {suites.validate(run)}")
  print(f"{len(runs)} run(s) valid; nothing was run (--dry_run)")
  return 0


def run(request: SuiteRequest) -> int:
  if not request.suite:
    raise UsageError("no --suite given; pass e.g. --suite=table1_local "
                     f"(suites: {', '.join(suites.available())})")
  if request.run_timeout_s <= 0 or request.grace_s < 0:
    raise UsageError(f"--run_timeout_s={request.run_timeout_s:g} / --grace_s="
                     f"{request.grace_s:g}; use a positive timeout and a grace >= 0")
  suites.check_train_flags(request.train_flag)
  suite = suites.load(request.suite)
  runs = suites.expand(suite)
  for r in runs:  # every run checked before the first starts
    suites.validate(r)
    if request.launcher == "srun":
      r.command("", launcher="srun")  # what a Slurm step cannot be: UsageError
  if (request.launcher == "srun" and not request.dry_run
      and topology.launched().launcher != "slurm"):
    raise UsageError("--launcher=srun runs each run as a job step of the Slurm job the "
                     "suite runs in, and this process is in none; submit it with sbatch "
                     "(scripts/slurm/suite.sbatch) or run it inside salloc")
  allocation = launchers.slurm_allocation()
  if request.launcher == "srun" and allocation is not None:
    # Every run of the suite, not only this array task's share: all tasks of an array
    # were submitted alike, so all of them run, or all refuse here.
    suites.check_allocation(runs, allocation)
  task = shares.array_task()
  if request.share == "slurm_array":
    if task is None:
      raise UsageError("--share=slurm_array runs this Slurm array task's share of the "
                       "suite, and this process is in no array job; submit it with "
                       "sbatch --array=0-N scripts/slurm/suite.sbatch")
    runs = shares.share(runs, task, suite.name)
  if request.dry_run:
    return dry_run(runs)

  results_path = _default_results(suite, request)
  malformed = results.check_appendable(results_path)
  for number, problem in malformed:
    print(f"warning: {results_path}:{number} is not a record ({problem}); left "
          "untouched", file=sys.stderr)
  logs_dir = pathlib.Path(request.logs_dir
                          or re.sub(r"\.jsonl$", "", results_path) + ".logs")
  try:
    logs_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise UsageError(f"--logs_dir={logs_dir} cannot be created ({e.strerror}); "
                     "choose another") from None

  done = suites.done_keys(results.read(results_path)[0])
  todo = [r for r in runs if r.key not in done]
  claims = None
  if task is not None:  # other tasks of the array may be given the same runs
    claims = shares.Claims(re.sub(r"\.jsonl$", "", results_path) + ".claims", task)
    claims.claim_all(todo)
  whose = f" (array task {task.name} of {task.count}, share {request.share})" if task else ""
  print(f"suite {suite.name}{whose}: {len(runs)} run(s), {len(runs) - len(todo)} already "
        f"done in {results_path} (skipped), {len(todo)} to run; logs in {logs_dir}/",
        flush=True)
  durations, failures, finished = {}, [], 0
  started = time.monotonic()
  previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
  try:
    for index, r in enumerate(todo, start=1):
      position = f"[{index}/{len(todo)}] {r.label}"
      log_path = _log_path(logs_dir, r)
      print(f"{position}: running (log {log_path})", flush=True)
      seen = {rec["run_id"] for rec in results.read(results_path)[0]}
      run_started = time.monotonic()
      ending = _execute(r, results_path, log_path, request)
      durations.setdefault(r.group, []).append(time.monotonic() - run_started)
      new = [rec for rec in results.read(results_path)[0]
             if rec["run_id"] not in seen and suites.record_key(rec) == r.key]
      status, line = _outcome(ending, new, log_path)
      if claims is not None:
        claims.release(r)  # ended: a later submission may retry it
      finished += 1
      if status in ("failed", "died", "interrupted"):
        failures.append(f"{r.label}: {line}")
      print(f"{position}: {line} in {_duration(durations[r.group][-1])} | "
            f"{index}/{len(todo)} done, {time_left(todo[index:], durations)}", flush=True)
  except (KeyboardInterrupt, _Terminated) as e:
    signum = e.signum if isinstance(e, _Terminated) else signal.SIGINT
    print(f"error: interrupted by {signal.Signals(signum).name}; stopped the running "
          f"child, which records what it measured as interrupted; {finished} of "
          f"{len(todo)} run(s) finished{_kept(results_path)}; {_resume(task)} to "
          "resume", file=sys.stderr)
    return 128 + signum
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  print(f"suite {suite.name}: {finished} run(s) finished, {len(failures)} of them "
        f"failed, {len(runs) - len(todo)} skipped as already done; took "
        f"{_duration(time.monotonic() - started)}{_kept(results_path)}")
  for failure in failures:
    print(f"  failed: {failure}")
  if failures:
    print(f"error: {len(failures)} run(s) failed (listed above); {_resume(task)} to retry "
          "only those", file=sys.stderr)
    return 1
  return 0


def _kept(results_path: str) -> str:
  """Where the records are, said only where there are some."""
  return f"; records in {results_path}" if os.path.isfile(results_path) else ""


def _resume(task) -> str:
  """How to run what is left: the same command, or, for an array task, the task again
  (resubmitting the array would start every task)."""
  if task is None:
    return "rerun the same command"
  return f"requeue this array task (scontrol requeue {task.name})"


def _log_path(logs_dir: pathlib.Path, run: suites.Run) -> pathlib.Path:
  """The run's log: named by key as well as label, and a new file for each attempt, an
  earlier attempt's (interrupted, failed) kept beside it."""
  stem = f"{re.sub(r'[^A-Za-z0-9]+', '_', run.label)}-{run.key[:8]}"
  path, attempt = logs_dir / f"{stem}.log", 1
  while path.exists():
    attempt += 1
    path = logs_dir / f"{stem}.attempt{attempt}.log"
  return path


def main(argv) -> int:
  values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(SuiteRequest)}
  request = SuiteRequest(**dict(values, train_flag=tuple(values["train_flag"])))
  return errors.run_entry_point(lambda: run(request), argv)


if __name__ == "__main__":
  entry.start(main)
