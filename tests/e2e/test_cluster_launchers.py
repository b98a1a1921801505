"""Runs started by the launchers clusters use, each real, each leaving one record that
says how it was started (docs/clusters.md): jax and torch under srun, mpirun and
torchrun; tf2 (SlurmClusterResolver) and mtf (a chief and its workers) under srun,
these four as one suite's steps under sbatch; ray by Ray's Slurm recipe; srun's
torch tasks, one killed mid-run, and jax's, scancelled; a suite as a job array, one
task requeued mid-run, and a task refused a run that another live task holds. How each launcher's variables become a rank, a size
and a coordinator is tests/unit/test_launchers.py's.

Slurm is the `slurm` fixture's (tests/slurm_cluster.py: one node, in a private
network namespace, once per session); torchrun and mpirun run in that namespace too,
so nothing they serve is reachable from other machines."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

import tf_tput
from tf_tput import suite as suites
from tf_tput.records import results
from tf_tput.runtime import cpus

REPO = tf_tput.REPO_ROOT
# The launchers' plumbing on the quickest 2-device run: decoder_tiny at 16 positions
# (tests/e2e/test_interrupted_runs.py's, so jax's program is compiled once a session).
TARGETS_LENGTH = 16
TINY = ["--gin_file=decoder_tiny", "--gin_file=data2",
        f"--gin_param=DataConfig.targets_length={TARGETS_LENGTH}", "--steps=2",
        "--warmup_steps=1", "--log_every=1"]
RUN_TIMEOUT_S = 240  # XLA:CPU's collectives never time out: the wall clock does


def _train(system: str, results_path, *flags) -> list:
  return ["-m", "tf_tput.train", f"--system={system}", *TINY,
          f"--results={results_path}", *flags]


def _run(command, slurm, cwd) -> subprocess.CompletedProcess:
  return subprocess.run(command, env=dict(os.environ, **slurm.env()), cwd=cwd,
                        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _one_record(path, proc, launcher: str, num_processes: int) -> dict:
  out = f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  records, problems = results.read(str(path))
  assert not problems and len(records) == 1, out
  record = records[0]
  assert record["status"] == "ok", (record["error"], out)
  assert proc.returncode == 0, out
  assert (record["launcher"], record["num_processes"]) == (launcher, num_processes)
  return record


# jax's processes get one virtual CPU device each: two devices for data2.
JAX_FLAGS = ["--num_cpu_devices=1"]


@pytest.mark.parametrize("system, flags", [("jax", JAX_FLAGS), ("torch", [])])
def test_mpirun_two_ranks_are_one_run(slurm, tmp_path, system, flags):
  """As docs/clusters.md runs it: --bind-to none, each rank on every CPU."""
  path = tmp_path / "r.jsonl"
  proc = _run(slurm.mpirun_command(2, ["--bind-to", "none", sys.executable,
                                       *_train(system, path, *flags)]), slurm, tmp_path)
  record = _one_record(path, proc, "mpirun", 2)
  assert record["job_id"] and record["num_devices"] == 2  # job_id: mpirun's job
  assert (record["env"]["cpu_binding"], record["env"]["cpu_affinity"]) == (
      "none", cpus.as_list(range(slurm.cpus)))
  assert "CPUs narrowed" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("system, flags", [("jax", JAX_FLAGS), ("torch", [])])
def test_torchrun_two_workers_are_one_run(slurm, tmp_path, system, flags):
  path = tmp_path / "r.jsonl"
  torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
  proc = _run(slurm.exec_prefix() + torchrun + _train(system, path, *flags), slurm, tmp_path)
  record = _one_record(path, proc, "torchrun", 2)
  assert record["job_id"] and record["num_devices"] == 2  # job_id: torchrun's run id


# The suite cluster_local with decoder_tiny for t5_tiny (the runs exercise the
# launchers, not T5): the same file, its model and lengths overridden, as
# tests/e2e/test_readme_commands.py shrinks table1_local.
SHRUNK_CLUSTER_LOCAL = """include '{real}'
TrainMatrix.models = ['decoder_tiny']
TrainMatrix.gin_params = ['DataConfig.targets_length = {targets_length}']
"""


def test_a_suite_under_sbatch_runs_each_system_as_srun_s_tasks(slurm, tmp_path):
  """scripts/slurm/suite.sbatch: tf_tput.suite --launcher=srun in the batch script,
  each run of cluster_local (shrunk to decoder_tiny) a job step: jax and torch
  processes, tf2's MultiWorkerMirroredStrategy workers (TF's SlurmClusterResolver),
  mtf's chief (task 0) and its 2 worker servers, 3 tasks on the job's 2 CPUs
  (--overcommit)."""
  path, suite = tmp_path / "r.jsonl", tmp_path / "cluster_local.gin"
  suite.write_text(SHRUNK_CLUSTER_LOCAL.format(
      real=REPO / "gin" / "suites" / "cluster_local.gin", targets_length=TARGETS_LENGTH))
  assert suites.load(str(suite)).name == "cluster_local"
  job = slurm.sbatch(str(REPO / "scripts" / "slurm" / "suite.sbatch"),
                     ["--ntasks=2", "--overcommit", f"--export=ALL,PYTHON={sys.executable}"],
                     [f"--suite={suite}", f"--results={path}"], cwd=str(REPO))
  code, state = slurm.wait_job(job, timeout=2 * RUN_TIMEOUT_S)
  out = open(slurm.output_path(job), errors="replace").read()[-4000:]
  records, problems = results.read(str(path))
  assert (code, state, problems) == (0, "COMPLETED", []), out
  assert [(r["system"], r["status"], r["launcher"], r["num_processes"], r["num_devices"],
           r["job_id"]) for r in records] == [
      (system, "ok", "slurm", 2, 2, str(job)) for system in ("jax", "torch", "tf2", "mtf")], out
  assert [a["task"] for a in records[-1]["env"]["accelerators"]] == [
      "/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]  # mtf's servers
  assert [r["concurrent_runs"] for r in records] == [[]] * 4  # --exclusive, one by one
  # Both tasks of jax's step log the run id process 0 recorded, each line labelled.
  [log] = (path.parent / "r.logs").glob("decoder_tiny_jax_*.log")
  text = log.read_text(errors="replace")
  assert set(re.findall(r"run ([0-9a-f]{12}): ", text)) == {records[0]["run_id"]}, text[-3000:]
  assert {line.split(":", 1)[0] for line in text.splitlines()[1:] if line.strip()} == {
      "0", "1"}, text[-3000:]


def test_ray_under_sbatch_by_ray_s_recipe(slurm, tmp_path):
  path = tmp_path / "r.jsonl"
  script = str(REPO / "scripts" / "slurm" / "ray.sbatch")
  job = slurm.sbatch(script, ["--nodes=1", f"--cpus-per-task={slurm.cpus}",
                              f"--chdir={REPO}", f"--export=ALL,PYTHON={sys.executable}"],
                     [*TINY, "--num_cpu_devices=2", f"--results={path}"])
  code, state = slurm.wait_job(job, timeout=RUN_TIMEOUT_S)
  out = open(slurm.output_path(job), errors="replace").read()[-3000:]
  assert (code, state) == (0, "COMPLETED"), out
  record = _one_record(path, subprocess.CompletedProcess([], 0, out, ""), "slurm", 1)
  assert record["system"] == "ray" and record["job_id"] == str(job)
  assert not slurm.jobs()
  assert not [p for p in slurm.pids() if _command(p).find("raylet") >= 0]


def _command(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace")
  except OSError:
    return ""


def test_a_task_killed_mid_run_leaves_process_0_s_failed_record(slurm, tmp_path):
  path = tmp_path / "r.jsonl"
  command = slurm.srun_command(["-n", "2", sys.executable, *_train(
      "torch", path, "--steps=100000", "--log_every=1")])
  proc = subprocess.Popen(command, env=dict(os.environ, **slurm.env()), cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    victim = _wait_for_measured_steps_then_task_1(proc, slurm)
    os.kill(victim, signal.SIGKILL)
    out = proc.communicate(timeout=RUN_TIMEOUT_S)[0]
  finally:
    proc.kill()
  records, _ = results.read(str(path))
  assert proc.returncode != 0, out[-3000:]
  assert [r["status"] for r in records] == ["failed"], out[-3000:]
  record = records[0]
  # the two tasks had joined as one run: they trained measured steps together
  assert (record["launcher"], record["num_processes"]) == ("slurm", 2)
  assert len(record["losses"]) >= 2


def test_scancel_mid_run_leaves_process_0_s_interrupted_record(slurm, tmp_path):
  """As a preemption: every task gets SIGTERM, process 0 records what was measured."""
  path = tmp_path / "r.jsonl"
  command = slurm.srun_command(["-n", "2", sys.executable, *_train(
      "jax", path, *JAX_FLAGS, "--steps=100000", "--log_every=1")])
  proc = subprocess.Popen(command, env=dict(os.environ, **slurm.env()), cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    task_1 = _wait_for_measured_steps_then_task_1(proc, slurm)
    slurm.cancel(_environ(task_1)["SLURM_JOB_ID"])
    out = proc.communicate(timeout=RUN_TIMEOUT_S)[0]
  finally:
    proc.kill()
  records, _ = results.read(str(path))
  assert proc.returncode != 0, out[-3000:]
  assert [(r["status"], r["signal"]) for r in records] == [("interrupted", "SIGTERM")], out[-3000:]
  assert (records[0]["launcher"], records[0]["num_processes"]) == ("slurm", 2)
  assert records[0]["steps_measured"] >= 1


def _wait_for_measured_steps_then_task_1(proc, slurm) -> int:
  """Task 1's pid once its train has logged a measured step."""
  deadline = time.monotonic() + RUN_TIMEOUT_S
  seen = ""
  while time.monotonic() < deadline:
    line = proc.stdout.readline()
    seen += line
    if "step 2/" in line or "step 3/" in line:
      for pid in slurm.pids():
        environ = _environ(pid)
        if environ.get("SLURM_PROCID") == "1" and "tf_tput.train" in _command(pid):
          return pid
    if not line and proc.poll() is not None:
      break
  raise AssertionError(f"no measured step seen: {seen[-3000:]}")


def _environ(pid: int) -> dict:
  try:
    with open(f"/proc/{pid}/environ", "rb") as f:
      return dict(item.split("=", 1) for item in f.read().decode(errors="replace")
                  .split("\0") if "=" in item)
  except OSError:
    return {}


# 3 quick one-process runs, each long enough to be stopped mid-measurement, and a
# run of 4 processes, whose job step needs 4 tasks.
ARRAY_SUITE = ("Suite.name = 'array'\nSuite.matrices = [@TrainMatrix(), @p4/TrainMatrix()]\n"
               "TrainMatrix.models = ['decoder_tiny']\nTrainMatrix.systems = ['jax']\n"
               "TrainMatrix.global_batches = [2, 4, 6]\nTrainMatrix.steps = 300\n"
               "TrainMatrix.warmup_steps = 1\nTrainMatrix.num_cpu_devices = 1\n"
               "TrainMatrix.gin_params = ['DataConfig.targets_length = 16']\n"
               "p4/TrainMatrix.global_batches = [8]\np4/TrainMatrix.meshes = ['data4']\n"
               "p4/TrainMatrix.processes = 4\np4/TrainMatrix.steps = 20\n")
SUITE_SBATCH = str(REPO / "scripts" / "slurm" / "suite.sbatch")


def test_an_array_that_cannot_hold_a_run_refuses_in_one_line_before_any_run(slurm, tmp_path):
  """sbatch --array=0-2 --requeue scripts/slurm/suite.sbatch --suite=cluster_local, as
  written: each task has the node's 2 CPUs (--exclusive), and mtf's step needs 3 tasks;
  every task refuses the whole suite in one line naming that run, exit 2, no record."""
  path = tmp_path / "r.jsonl"
  job = slurm.sbatch(SUITE_SBATCH, ["--array=0-2", "--requeue",
                                    f"--output={tmp_path}/tf_tput-suite-%A_%a.out",
                                    f"--export=ALL,PYTHON={sys.executable}"],
                     ["--suite=cluster_local", f"--results={path}"], cwd=str(REPO))
  _wait_for(lambda: not slurm.jobs(), "the array to end")
  for task in range(3):
    out = (tmp_path / f"tf_tput-suite-{job}_{task}.out").read_text(errors="replace")
    assert slurm.wait_job(f"{job}_{task}")[0] == 2, out[-3000:]
    [error] = [line for line in out.splitlines() if "error" in line.lower()]
    assert error.startswith("error: run 't5_tiny mtf multi_worker") and (
        "3 tasks" in error and "--overcommit" in error), out[-3000:]
  assert not path.exists()


def test_a_suite_as_a_job_array_runs_each_run_once_and_a_requeued_task_resumes(
    slurm, tmp_path):
  """sbatch --array=0-2 --overcommit scripts/slurm/suite.sbatch: 3 tasks share 4 runs
  (task 0 the first and the fourth, of 4 processes) through one results file, one task
  after another (--exclusive); task 0, requeued mid-run (SIGTERM, as a preemption),
  records that run as interrupted and, started again, runs it and its other run.
  Every run then has exactly one ok record, which names its array task."""
  suite, path = tmp_path / "array.gin", tmp_path / "r.jsonl"
  suite.write_text(ARRAY_SUITE)
  job = slurm.sbatch(SUITE_SBATCH, ["--array=0-2", "--requeue", "--overcommit",
                                    f"--output={tmp_path}/tf_tput-suite-%A_%a.out",
                                    f"--export=ALL,PYTHON={sys.executable}"],
                     [f"--suite={suite}", f"--results={path}"], cwd=str(REPO))
  _wait_for(lambda: "step 10/" in _logs(tmp_path / "r.logs", "batch_2-"), "task 0 measuring")
  slurm.requeue(f"{job}_0")
  _wait_for(lambda: not slurm.jobs(), "the array to end", timeout=4 * RUN_TIMEOUT_S)
  outs = {i: (tmp_path / f"tf_tput-suite-{job}_{i}.out").read_text(errors="replace")
          for i in range(3)}
  out = "".join(text[-2000:] for text in outs.values())
  records, problems = results.read(str(path))
  assert problems == [], out
  ok = sorted((r["global_batch"], r["num_processes"], r["array_task_id"]) for r in records
              if r["status"] == "ok")
  assert ok == [(2, 1, 0), (4, 1, 1), (6, 1, 2), (8, 4, 0)], out  # each run once
  assert {(r["array_job_id"], r["packed"], str(r["concurrent_runs"])) for r in records} == {
      (str(job), False, "[]")}, out  # one task at a time
  [stopped] = [r for r in records if r["status"] != "ok"]
  assert (stopped["status"], stopped["signal"], stopped["global_batch"]) == (
      "interrupted", "SIGTERM", 2), out
  assert stopped["steps_measured"] >= 10
  assert f"scontrol requeue {job}_0" in outs[0], outs[0][-3000:]
  assert len(list((tmp_path / "r.logs").glob("*batch_2-*attempt2.log"))) == 1  # both kept
  assert not list((tmp_path / "r.claims").iterdir())  # every claim released


# Two one-process runs, one per task of a packed array.
PACKED_SUITE = ("Suite.name = 'packed'\nSuite.matrices = [@TrainMatrix()]\n"
                "TrainMatrix.models = ['decoder_tiny']\nTrainMatrix.systems = ['jax']\n"
                "TrainMatrix.global_batches = [2, 4]\nTrainMatrix.steps = 40\n"
                "TrainMatrix.warmup_steps = 1\nTrainMatrix.num_cpu_devices = 1\n"
                "TrainMatrix.gin_params = ['DataConfig.targets_length = 16']\n")


def test_a_packed_array_shares_the_node_and_its_records_say_so(slurm, tmp_path):
  """sbatch --oversubscribe (over the script's --exclusive) and --train_flag=--packed:
  both tasks run at once, and each record lists the other run as concurrent, asked."""
  suite, path = tmp_path / "packed.gin", tmp_path / "r.jsonl"
  suite.write_text(PACKED_SUITE)
  job = slurm.sbatch(SUITE_SBATCH, ["--array=0-1", "--oversubscribe",
                                    f"--output={tmp_path}/task-%a.out",
                                    f"--export=ALL,PYTHON={sys.executable}"],
                     [f"--suite={suite}", f"--results={path}", "--train_flag=--packed"],
                     cwd=str(REPO))
  _wait_for(lambda: not slurm.jobs(), "the array to end")
  out = "".join((tmp_path / f"task-{i}.out").read_text(errors="replace") for i in range(2))
  records, _ = results.read(str(path))
  assert sorted((r["status"], r["packed"], r["array_job_id"]) for r in records) == [
      ("ok", True, str(job))] * 2, out[-3000:]
  first, second = records
  assert (first["concurrent_runs"], second["concurrent_runs"]) == (
      [second["run_id"]], [first["run_id"]]), out[-3000:]


def test_a_run_another_live_task_holds_is_refused_in_one_line(slurm, tmp_path):
  """A claim of the suite's first run by a live array task (a sleeping job's): a task
  of another array given that run refuses the whole share, exit 2, nothing run."""
  suite, path = tmp_path / "array.gin", tmp_path / "r.jsonl"
  suite.write_text(ARRAY_SUITE)
  sleeper = tmp_path / "sleep.sh"
  sleeper.write_text("#!/bin/sh\nsleep 120\n")
  holder = slurm.sbatch(str(sleeper), ["--array=0-0", "--oversubscribe"])
  claims = tmp_path / "r.claims"
  claims.mkdir()
  first = suites.expand(suites.load(str(suite)))[0]
  (claims / first.key).write_text(f"{holder}_0\n")
  # Beside the holder, over the script's --exclusive (Slurm shares a node only
  # between jobs that both allow it); --overcommit for the suite's 4-task step.
  job = slurm.sbatch(SUITE_SBATCH,
                     ["--array=0-0", "--oversubscribe", "--overcommit",
                      f"--output={tmp_path}/task-%a.out",
                      f"--export=ALL,PYTHON={sys.executable}"],
                     [f"--suite={suite}", f"--results={path}"], cwd=str(REPO))
  code, state = slurm.wait_job(job, timeout=RUN_TIMEOUT_S)
  slurm.cancel(holder)
  out = (tmp_path / "task-0.out").read_text(errors="replace")
  assert (code, state) == (2, "FAILED"), out[-3000:]
  errors = [line for line in out.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and f"claimed by array task {holder}_0" in errors[0], out[-3000:]
  assert "--share=slurm_array" in errors[0]
  assert not path.exists() and [p.name for p in claims.iterdir()] == [first.key]


def _logs(directory, name_part: str) -> str:
  if not directory.exists():
    return ""
  return "".join(p.read_text(errors="replace") for p in directory.iterdir()
                 if name_part in p.name)


def _wait_for(ready, what: str, timeout: float = RUN_TIMEOUT_S) -> None:
  deadline = time.monotonic() + timeout
  while not ready():
    if time.monotonic() > deadline:
      raise AssertionError(f"no {what} within {timeout} s")
    time.sleep(0.2)


# --- the docs' and scripts' Slurm commands, as written ------------------------------

DOCUMENTED = [REPO / "docs" / "clusters.md", REPO / "docs" / "suites.md",
              *sorted((REPO / "scripts" / "slurm").glob("*.sbatch")),
              *sorted((REPO / "gin" / "suites").glob("*.gin"))]


def _documented_commands() -> list:
  """(file, argv) of every sbatch or srun command line in a code block of the docs
  (4-space indented) or in a header comment of a script or suite file ("#   ")."""
  found = []
  for path in DOCUMENTED:
    block = "    " if path.suffix == ".md" else "#   "
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
      if not line.startswith(block) or line[len(block):].split(" ")[0] not in ("sbatch",
                                                                             "srun"):
        continue
      text = line[len(block):]
      while text.rstrip().endswith("\\"):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i].lstrip("# ")
      found.append((path.name, shlex.split(text, comments=True)))
  return found


def _entry_point_flags() -> dict:
  """Entry point -> its flags, from docs/flags.md (tests/unit/test_docs.py holds it
  equal to the code)."""
  flags, module = {}, None
  for line in (REPO / "docs" / "flags.md").read_text().splitlines():
    if line.startswith("## "):
      module = line[3:].strip()
    elif line.startswith("| `--"):
      flags.setdefault(module, set()).add(line.split("`")[1][2:])
  return flags


def _check_tf_tput_args(where: str, module: str, args: list, known: dict) -> None:
  from tf_tput import config
  for arg in args:
    assert arg.startswith("--"), f"{where}: {arg!r} is not a flag"
    name, _, value = arg[2:].partition("=")
    assert name in known[module] or (name.startswith("no") and name[2:] in known[module]), (
        f"{where}: {module} has no flag --{name}")
    if name == "suite":
      suites.load(value)
    elif name == "gin_file":
      config.resolve_gin_file(value)
    elif name == "train_flag":
      _check_tf_tput_args(where, "tf_tput.train", [value], known)


def _one_node(options: list, cpus: int) -> list:
  """The docs' adaptation ("On one node", docs/clusters.md) of sbatch/srun options."""
  text = " ".join(options).replace("--nodes=2 --ntasks-per-node=1", "--ntasks=2")
  adapted = shlex.split(text)
  tasks = next((int(o.split("=")[1]) for o in adapted if o.startswith("--ntasks=")), 1)
  if "-n" in adapted:
    tasks = int(adapted[adapted.index("-n") + 1])
  adapted = [f"--cpus-per-task={min(int(o.split('=')[1]), max(1, cpus // tasks))}"
             if o.startswith("--cpus-per-task=") else o for o in adapted]
  return adapted + (["--overcommit"] if tasks > cpus and "--overcommit" not in adapted
                    else [])


def test_every_documented_slurm_command_runs_as_written_or_as_adapted(slurm, tmp_path):
  """Each sbatch/srun line of docs/clusters.md, docs/suites.md, the scripts' and suite
  files' headers: its script exists, its tf_tput flags, suite and gin files exist, and
  Slurm accepts its options (--test-only), adapted to one node as the docs say."""
  commands, known = _documented_commands(), _entry_point_flags()
  assert {name for name, _ in commands} >= {"clusters.md", "suites.md", "suite.sbatch",
                                            "train.sbatch", "ray.sbatch"}, commands
  for name, argv in commands:
    where = f"{name}: {shlex.join(argv)}"
    if argv[0] == "sbatch":
      [script] = [i for i, a in enumerate(argv) if a.endswith(".sbatch")]
      assert (REPO / argv[script]).is_file(), where
      module = "tf_tput.suite" if argv[script].endswith("suite.sbatch") else "tf_tput.train"
      _check_tf_tput_args(where, module, argv[script + 1:], known)
      check = ["sbatch", "--test-only", *_one_node(argv[1:script], slurm.cpus),
               str(REPO / argv[script])]
    else:
      program = argv.index("-m")
      _check_tf_tput_args(where, argv[program + 1], argv[program + 2:], known)
      check = ["srun", "--test-only", *_one_node(argv[1:program - 1], slurm.cpus), "true"]
    proc = subprocess.run(slurm.exec_prefix() + check, env=dict(os.environ, **slurm.env()),
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "to start at" in proc.stderr, (
        f"{where}\n{shlex.join(check)}: {proc.stderr[-500:]}")
