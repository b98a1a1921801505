"""tf_tput.suite end to end: real child runs, a failure, resuming, Ctrl-C, bad input."""

import os
import pathlib
import signal
import subprocess
import sys
import time

from tf_tput.records import results

from cli_helpers import REPO, error_lines, run_cli

# One device, one measured step of decoder_tiny at 16 positions: the quickest real runs
# of each system.
SHORT = "TrainMatrix.gin_params = ['DataConfig.targets_length = 16']\n"
HEAD = ("Suite.name = 'e2e'\n"
        "TrainMatrix.steps = 1\nTrainMatrix.warmup_steps = 1\n"
        "TrainMatrix.num_cpu_devices = 1\n" + SHORT +
        "ok/TrainMatrix.models = ['decoder_tiny']\nok/TrainMatrix.systems = ['mtf']\n")
# A tfds dataset that does not exist: the request passes train's check (reading the
# dataset needs TensorFlow), so the run fails while building its batches and appends a
# failed record (tf_tput.train: every request its check accepts ends in a record).
BROKEN = ("broken/TrainMatrix.models = ['decoder_tiny']\n"
          "broken/TrainMatrix.systems = ['jax']\n"
          "broken/TrainMatrix.gin_params = [\"DataConfig.source = 'tfds'\", "
          "\"DataConfig.tfds_name = 'no_such_dataset'\"]\n")
MORE = ("more/TrainMatrix.models = ['decoder_tiny']\n"
        "more/TrainMatrix.systems = ['jax']\n")


def _suite_file(tmp_path, name: str, matrices: str, text: str) -> str:
  path = tmp_path / f"{name}.gin"
  path.write_text(HEAD + text + f"Suite.matrices = [{matrices}]\n")
  return str(path)


def _records(path) -> list:
  records, problems = results.read(str(path))
  assert problems == []
  return records


def test_failure_is_named_the_suite_goes_on_and_a_resume_reruns_nothing_that_succeeded(
    tmp_path, no_leftover_processes):
  out = tmp_path / "suite.jsonl"
  first = _suite_file(tmp_path, "first", "@broken/TrainMatrix(), @ok/TrainMatrix()", BROKEN)
  proc = run_cli("tf_tput.suite", f"--suite={first}", f"--results={out}")
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "[1/2] decoder_tiny jax" in proc.stdout and "[2/2] decoder_tiny mtf" in proc.stdout
  assert ("failed (exit code 1), recorded: batches: UsageError: tfds dataset "
          "'no_such_dataset'") in proc.stdout
  assert "left for 1 run(s)" in proc.stdout  # progress with an estimate
  assert "2 run(s) finished, 1 of them failed" in proc.stdout
  assert len(error_lines(proc.stderr)) == 1
  failed, ok = _records(out)
  assert failed["status"] == "failed" and failed["model"] == "decoder_tiny"
  assert ok["status"] == "ok" and ok["model"] == "decoder_tiny" and ok["steps"] == 1
  first_line = out.read_text()

  # A suite with the succeeded run and a new one: only the new one runs.
  second = _suite_file(tmp_path, "second", "@ok/TrainMatrix(), @more/TrainMatrix()", MORE)
  proc = run_cli("tf_tput.suite", f"--suite={second}", f"--results={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "2 run(s), 1 already done" in proc.stdout and "decoder_tiny mtf" not in proc.stdout
  assert out.read_text().startswith(first_line)
  assert [(r["model"], r["system"], r["status"]) for r in _records(out)] == [
      ("decoder_tiny", "jax", "failed"), ("decoder_tiny", "mtf", "ok"),
      ("decoder_tiny", "jax", "ok")]

  # Everything done: nothing runs, nothing is written.
  before = out.read_text()
  proc = run_cli("tf_tput.suite", f"--suite={second}", f"--results={out}")
  assert proc.returncode == 0 and "2 already done" in proc.stdout
  assert "running" not in proc.stdout and out.read_text() == before


def test_ctrl_c_stops_the_child_which_records_what_it_measured(tmp_path,
                                                               no_leftover_processes):
  suite = tmp_path / "long.gin"
  suite.write_text("Suite.name = 'long'\nSuite.matrices = [@TrainMatrix()]\n"
                   "TrainMatrix.models = ['decoder_tiny']\nTrainMatrix.systems = ['jax']\n"
                   "TrainMatrix.steps = 1000000\n" + SHORT)
  out = tmp_path / "long.jsonl"
  env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  proc = subprocess.Popen([sys.executable, "-m", "tf_tput.suite", f"--suite={suite}",
                           f"--results={out}"], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert "to run" in proc.stdout.readline()
    running = proc.stdout.readline()
    log = pathlib.Path(running.split("(log ")[1].rstrip(")\n"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        log.exists() and "step 10/" in log.read_text()):
      time.sleep(0.2)  # until the child measures
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 130, stderr[-2000:]
  assert len(error_lines(stderr)) == 1 and "interrupted by SIGINT" in stderr
  [record] = _records(out)
  assert record["status"] == "interrupted" and record["signal"] == "SIGTERM"
  assert record["steps_measured"] >= 10 and record["tokens_per_sec"] > 0


def test_bad_suite_input_is_one_error_line(tmp_path):
  suite = tmp_path / "bad.gin"
  suite.write_text("Suite.name = 'bad'\nSuite.matrices = [@TrainMatrix()]\n"
                   "TrainMatrix.modles = ['t5_tiny']\n")
  for args, expect in ((f"--suite={suite}", "modles"),
                       ("--suite=gin/suites/nope.gin", "nope.gin"),
                       ("--suite=table1_local --run_timeout_s=0", "--run_timeout_s=0"),
                       ("--suite=cluster_local --launcher=srun", "is in none; submit it "
                        "with sbatch"),  # not in a Slurm job
                       ("--suite=islands_local --launcher=srun", "cannot make islands"),
                       ("--suite=cluster_local --share=slurm_array", "in no array job")):
    proc = run_cli("tf_tput.suite", *args.split(), f"--results={tmp_path / 'r.jsonl'}")
    assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
    assert expect in proc.stderr
  assert not (tmp_path / "r.jsonl").exists()


def test_dry_run_refuses_a_strategy_train_would_refuse(tmp_path):
  suite = tmp_path / "tpu32.gin"
  suite.write_text("Suite.name = 'tpu32'\nSuite.matrices = [@TrainMatrix()]\n"
                   "TrainMatrix.models = ['t5_tiny']\nTrainMatrix.strategy = 'tpu'\n")
  proc = run_cli("tf_tput.suite", f"--suite={suite}", "--dry_run")
  assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
  assert "run 't5_tiny mtf tpu float32 single batch 8'" in proc.stderr
  assert "trains in bfloat16 activations" in proc.stderr and "TrainMatrix.dtypes" in proc.stderr


def test_dry_run_validates_the_paper_suites_and_runs_nothing(tmp_path):
  proc = run_cli("tf_tput.suite", "--suite=gin/suites/table1_paper.gin", "--dry_run",
                 cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[-1] == "12 run(s) valid; nothing was run (--dry_run)"
  assert "t5_11b jax bfloat16 data32_model16 batch 128" in proc.stdout
  assert "t5_11b pathways bfloat16 data32_model16 batch 128" in proc.stdout
  assert "512 devices" in proc.stdout and proc.stderr == ""
  assert not (tmp_path / "results").exists()


def test_a_micro_suite_records_each_run_and_resumes(tmp_path, no_leftover_processes):
  suite = tmp_path / "micro.gin"
  suite.write_text("Suite.name = 'micro'\nSuite.matrices = [@MicroMatrix()]\n"
                   "MicroMatrix.systems = ['jax']\nMicroMatrix.modes = ['opbyop', 'chained']\n"
                   "MicroMatrix.hosts = [1]\nMicroMatrix.chain_length = 8\n"
                   "MicroMatrix.computations = 16\nMicroMatrix.repeats = 1\n")
  out = tmp_path / "micro.jsonl"
  proc = run_cli("tf_tput.suite", f"--suite={suite}", f"--results={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert [(r["mode"], r["status"]) for r in _records(out)] == [
      ("opbyop", "ok"), ("chained", "not_applicable")]
  before = out.read_text()
  proc = run_cli("tf_tput.suite", f"--suite={suite}", f"--results={out}")
  assert proc.returncode == 0 and "2 already done" in proc.stdout
  assert out.read_text() == before
