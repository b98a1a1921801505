"""Runs that a signal ends, and runs whose peer hangs (runtime/watchdog.py;
docs/records.md, "status"): a SIGTERM mid-measurement leaves one `interrupted` record
with the steps measured so far and exit 143; a SIGSTOPped peer ends a 2-process run in
one `failed` record within --step_timeout_s, naming the step and the silent process."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tf_tput.records import results

from cli_helpers import REPO, Launched

STEP_TIMEOUT_S = 5
# decoder_tiny at 16 positions: the quickest steps of a 2-process run (and, without
# the mesh, of mtf's one process).
TWO_PROCESSES = ["--gin_file=decoder_tiny", "--gin_file=data2", "--num_cpu_devices=1",
                 "--gin_param=DataConfig.targets_length=16"]
ONE_PROCESS = ["--gin_file=decoder_tiny", "--gin_param=DataConfig.targets_length=16"]


def _only_record(path) -> dict:
  records, problems = results.read(str(path))
  assert problems == [] and len(records) == 1, (records, problems)
  return records[0]


def _launched(system: str, out, *extra) -> Launched:
  launched = Launched(["--num_processes=2", "--timeout_s=180", "--", sys.executable,
                       "-m", "tf_tput.train", f"--system={system}", *TWO_PROCESSES,
                       "--steps=1000000", "--log_every=1", f"--results={out}", *extra])
  launched.wait_for("step 3/", timeout=150)  # measuring
  return launched


def _process(launched: Launched, index: int) -> psutil.Process:
  found = [p for p in psutil.Process(launched.proc.pid).children(recursive=True)
           if p.environ().get("TF_TPUT_PROCESS_ID") == str(index)]
  assert len(found) == 1, found
  return found[0]


def _assert_interrupted(record: dict, num_processes: int) -> None:
  assert record["status"] == "interrupted" and record["signal"] == "SIGTERM", record["error"]
  assert record["error"].startswith("SIGTERM after "), record["error"]
  assert record["num_processes"] == num_processes
  measured = record["steps_measured"]
  assert 3 <= measured < record["steps"]
  assert len(record["window_s"]) == measured and all(t > 0 for t in record["window_s"])
  assert len(record["losses"]) == measured + record["warmup_steps"]
  assert record["tokens_per_sec"] > 0 and record["step_time_s"]["median"] > 0


@pytest.mark.loopback_ports  # the launcher's coordinator port (tests/conftest.py)
@pytest.mark.parametrize("system", ["jax", "torch"])
def test_sigterm_to_the_launcher_leaves_one_interrupted_record(system, tmp_path,
                                                               no_leftover_processes):
  out = tmp_path / "runs.jsonl"
  launched = _launched(system, out)
  sent = time.monotonic()
  launched.proc.send_signal(signal.SIGTERM)
  stderr = launched.finish(timeout=30)
  assert time.monotonic() - sent < 10, stderr[-3000:]  # inside Slurm's KillWait
  assert launched.proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  _assert_interrupted(_only_record(out), num_processes=2)  # process 0's only


@pytest.mark.loopback_ports
@pytest.mark.parametrize("system", ["jax", "torch"])
def test_a_stopped_peer_ends_the_run_in_a_failed_record_within_the_bound(
    system, tmp_path, no_leftover_processes):
  out = tmp_path / "runs.jsonl"
  launched = _launched(system, out, f"--step_timeout_s={STEP_TIMEOUT_S}")
  peer = _process(launched, 1)
  stopped = time.monotonic()
  peer.send_signal(signal.SIGSTOP)  # alive, silent: its collectives never complete
  stderr = launched.finish(timeout=60)
  waited = time.monotonic() - stopped
  assert STEP_TIMEOUT_S <= waited < STEP_TIMEOUT_S + 15, stderr[-3000:]
  assert launched.proc.returncode == 1, stderr[-3000:]
  assert "process 0 (pid" in stderr and "exited with code 1" in stderr, stderr[-3000:]
  record = _only_record(out)
  assert record["status"] == "failed" and record["signal"] is None
  error = record["error"]
  assert error.startswith("step ") and ": hung: its window did not end within 5 s" in error
  assert f"process 1 (pid {peer.pid}) silent" in error, error
  assert record["steps_measured"] >= 3 and record["tokens_per_sec"] > 0


def test_sigterms_to_an_mtf_run_leave_one_whole_interrupted_record(tmp_path,
                                                             no_leftover_processes):
  out = tmp_path / "runs.jsonl"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  proc = subprocess.Popen([sys.executable, "-m", "tf_tput.train", "--system=mtf",
                           *ONE_PROCESS, "--steps=1000000", "--log_every=1",
                           f"--results={out}"], cwd=REPO, env=env,
                          stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stderr:
      if "step 3/" in line:
        break
    proc.send_signal(signal.SIGTERM)
    for _ in range(20):  # more while it stops and writes: noted, never a torn record
      time.sleep(0.05)
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=30)[1]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  assert "error: run interrupted: SIGTERM after" in stderr
  _assert_interrupted(_only_record(out), num_processes=1)
