"""tf_tput.launch: processes on loopback, stopped on failure, on Ctrl-C, and at the end."""

import os
import signal
import subprocess
import sys
import time

from cli_helpers import REPO, error_lines, run_cli

# Each child records its pid, then behaves as its process id says.
CHILD = """
import os, pathlib, sys, time
index = int(os.environ["TF_TPUT_PROCESS_ID"])
assert os.environ["TF_TPUT_COORDINATOR"].startswith("127.0.0.1:")
assert os.environ["TF_TPUT_NUM_PROCESSES"] == "3"
pathlib.Path(sys.argv[1], str(index)).write_text(str(os.getpid()))
behaviour = sys.argv[2]
if behaviour == "die" and index == 1:
    time.sleep(1)
    sys.exit(3)
if behaviour != "ok":
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie has exited; only its parent's wait is missing.
  with open(f"/proc/{pid}/stat") as f:
    return f.read().split(")")[-1].split()[0] != "Z"


def _child_pids(pid_dir, count=3, timeout=30):
  deadline = time.monotonic() + timeout
  while len(list(pid_dir.iterdir())) < count and time.monotonic() < deadline:
    time.sleep(0.1)
  return [int(p.read_text()) for p in pid_dir.iterdir()]


def _launch(pid_dir, behaviour):
  return ["tf_tput.launch", "--num_processes=3", "--grace_s=2", "--", sys.executable,
          "-c", CHILD, str(pid_dir), behaviour]


def test_all_processes_succeed(tmp_path):
  proc = run_cli(*_launch(tmp_path, "ok"))
  assert proc.returncode == 0, proc.stderr
  assert len(_child_pids(tmp_path)) == 3


def test_a_dying_process_stops_the_others_and_is_named(tmp_path):
  start = time.monotonic()
  proc = run_cli(*_launch(tmp_path, "die"), timeout=60)
  assert time.monotonic() - start < 30
  assert proc.returncode == 1
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and "process 1" in errors[0] and "code 3" in errors[0]
  assert not any(_alive(pid) for pid in _child_pids(tmp_path))


def test_ctrl_c_stops_every_process(tmp_path):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  launcher = subprocess.Popen([sys.executable, "-m", *_launch(tmp_path, "hang")], cwd=REPO,
                              env=env, stderr=subprocess.PIPE, text=True)
  try:
    pids = _child_pids(tmp_path)
    assert len(pids) == 3 and all(_alive(pid) for pid in pids)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=30)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  assert launcher.returncode == 128 + signal.SIGINT
  assert "interrupted" in stderr
  assert not any(_alive(pid) for pid in pids)


def test_a_command_that_cannot_start_is_one_clear_error():
  proc = run_cli("tf_tput.launch", "--num_processes=2", "--", "/no/such/program")
  assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
  assert "/no/such/program" in proc.stderr


def test_a_single_controller_system_refuses_to_be_launched(tmp_path):
  proc = run_cli("tf_tput.launch", "--num_processes=2", "--", sys.executable, "-m",
                 "tf_tput.train", "--system=mtf", "--gin_file=gin/models/t5_tiny.gin",
                 f"--results={tmp_path / 'runs.jsonl'}")
  assert proc.returncode == 1
  assert "--system=mtf runs as one process" in proc.stderr
  assert "exited with code 2" in error_lines(proc.stderr)[-1]


def test_no_command_is_one_clear_error():
  proc = run_cli("tf_tput.launch", "--num_processes=2")
  assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
