"""When a launched process other than 0 dies, what process 0 records
(docs/clusters.md, "Faults"): its collective with the dead peer fails, and it appends
one `failed` record with the cause and the steps it completed, before the launcher
stops it; the launcher names the dead process and exits 1."""

import json
import signal
import sys

import psutil
import pytest

from cli_helpers import Launched


@pytest.mark.loopback_ports  # the launcher's coordinator port (tests/conftest.py)
def test_process_0_records_the_failure_when_another_process_dies(tmp_path,
                                                                no_leftover_processes):
  out = tmp_path / "runs.jsonl"
  launched = Launched(["--num_processes=2", "--timeout_s=120", "--", sys.executable, "-m",
                       "tf_tput.train", "--system=jax", "--gin_file=decoder_tiny",
                       "--gin_file=data2", "--num_cpu_devices=1", "--steps=100000",
                       "--gin_param=DataConfig.targets_length=16", "--log_every=1",
                       f"--results={out}"])
  launched.wait_for("warmup done", timeout=120)
  second = [p for p in psutil.Process(launched.proc.pid).children(recursive=True)
            if p.environ().get("TF_TPUT_PROCESS_ID") == "1"]
  assert len(second) == 1
  second[0].send_signal(signal.SIGKILL)
  stderr = launched.finish(timeout=60)
  assert launched.proc.returncode == 1, stderr[-3000:]
  assert "process 1 (pid" in stderr and "killed by signal 9" in stderr, stderr[-3000:]
  lines = out.read_text().splitlines()
  assert len(lines) == 1, lines
  record = json.loads(lines[0])
  assert record["status"] == "failed" and record["error"].startswith("step ")
  assert record["num_processes"] == 2 and len(record["losses"]) >= 1
