"""tf_tput.micro end to end: every system x mode, records, cleanup.

tf and ray at one host are covered mode by mode by tests/integration/test_micro_*.py;
here they run at 2 hosts, where processes can be left behind, and jax (no
integration test) at both."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import process_checks
from tf_tput import micro
from tf_tput.records import results
from tf_tput.runtime import namespaces

from cli_helpers import REPO, Launched, error_lines, run_cli

# Without root (or iproute2) no private network namespace can be made: tf's servers
# then listen on every interface, as --expose_servers says (test_no_exposed_servers.py).
EXPOSE = [] if namespaces.private_missing() is None else ["--expose_servers"]
FAST = ["--hosts=2", "--devices_per_host=2", "--chain_length=8", "--computations=16",
        "--repeats=1", "--timeout_s=120", *EXPOSE]


def _marked_env() -> dict:
  """The environment for a run whose every descendant can be found again."""
  return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
              **{process_checks.MARK: process_checks.new_mark()})


def _left_running(env: dict, since: float) -> list:
  return process_checks.left_running(since, env[process_checks.MARK])


def _micro(*args, env):
  return subprocess.run([sys.executable, "-m", "tf_tput.micro", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=600)


def _ray_installed() -> bool:
  return micro.system_module("ray").unavailable() is None


def _check_records(out, systems_modes_hosts: int):
  records = [json.loads(line) for line in out.read_text().splitlines()]
  for record in records:
    results.validate(record)
  by_key = {(r["system"], r["mode"], r["hosts"]): r for r in records}
  assert len(by_key) == systems_modes_hosts == len(records)
  for (system, mode, hosts), r in by_key.items():
    if system == "jax" and mode == "chained":
      assert r["status"] == "not_applicable"
    elif system == "ray" and not _ray_installed():
      assert r["status"] == "skipped" and "pip install" in r["error"]
    else:
      assert r["status"] == "ok", r
      assert r["computations_per_sec"] > 0 and len(r["repeats"]) == 1
      assert r["hosts"] * r["devices_per_host"] == 2 * hosts


@pytest.mark.alone  # TF's gRPC servers (tests/conftest.py)
def test_tf_runs_every_mode_at_two_hosts_checks_and_cleans_up(tmp_path):
  env, since = _marked_env(), time.time() - 1.0
  out = tmp_path / "micro.jsonl"
  proc = _micro("--systems=tf", *FAST, f"--results={out}", env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  _check_records(out, 3)
  assert _left_running(env, since) == []


@pytest.mark.loopback_ports  # jax's coordinator, Ray's ports (tests/conftest.py)
def test_jax_and_ray_run_every_mode_check_and_clean_up(tmp_path):
  env, since = _marked_env(), time.time() - 1.0
  out = tmp_path / "micro.jsonl"
  proc = _micro("--systems=jax,ray", *FAST, f"--results={out}", env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  one_host = _micro("--systems=jax", *FAST, "--hosts=1", f"--results={out}", env=env)
  assert one_host.returncode == 0, one_host.stderr[-3000:]
  _check_records(out, 2 * 3 + 3)
  assert "bare loop" in one_host.stdout  # printed beside one-host runs
  assert _left_running(env, since) == []


@pytest.mark.alone
def test_crossover_reports_a_duration_per_system_and_host_count(tmp_path):
  out = tmp_path / "micro.jsonl"
  proc = run_cli("tf_tput.micro", "--systems=tf,jax", "--modes=opbyop", "--hosts=1",
                 "--crossover", "--crossover_ms=0.3,3", "--crossover_repeat_s=0.02",
                 "--repeats=1", "--bare_loop=false", f"--results={out}", *EXPOSE,
                 timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [line for line in proc.stdout.splitlines() if line.startswith("crossover")]
  assert len(lines) == 1 and lines[0].startswith("crossover tf vs jax, 1 host(s): ")
  matmul = [json.loads(line) for line in out.read_text().splitlines()]
  matmul = [r for r in matmul if r["matmul_n"]]
  assert {r["computation_ms"] for r in matmul} == {0.3, 3.0}
  assert all(r["status"] == "ok" for r in matmul), [r["error"] for r in matmul]
  # Both sizes come from one calibrated rate (no second, noisy measurement): the
  # larger computation is a larger matmul, 10 ** (1/3) times the side up to rounding.
  n = {ms: {r["matmul_n"] for r in matmul if r["computation_ms"] == ms} for ms in (0.3, 3.0)}
  assert len(n[0.3]) == len(n[3.0]) == 1
  small, large = n[0.3].pop(), n[3.0].pop()
  assert large > small and abs(large - 10 ** (1 / 3) * small) <= 0.5 + 0.5 * 10 ** (1 / 3)
  # Every crossover record says how long its matmul took here, and the lines say it too.
  assert all(r["computation_ms_measured"] > 0 for r in matmul)
  assert "measured here" in lines[0]
  assert any(line.startswith("matmul sizing: ") for line in proc.stdout.splitlines())


@pytest.mark.alone
def test_ctrl_c_stops_every_host_and_keeps_the_records(tmp_path):
  env, since = _marked_env(), time.time() - 1.0
  out = tmp_path / "micro.jsonl"
  micro_run = Launched(["--systems=jax,tf", "--modes=opbyop", "--hosts=1,2",
                        "--computations=100000", "--chain_length=1", "--repeats=50",
                        f"--results={out}", *EXPOSE], module="tf_tput.micro", env=env)
  micro_run.wait_for("jax opbyop, 1 host(s)")  # the first run has begun
  time.sleep(3)  # its host is up and computing
  micro_run.proc.send_signal(signal.SIGINT)
  stderr = micro_run.finish(timeout=60)
  proc = micro_run.proc
  assert proc.returncode == 130, stderr[-2000:]
  assert len(error_lines(stderr)) == 1 and "interrupted" in error_lines(stderr)[0]
  for line in out.read_text().splitlines() if out.exists() else []:
    results.validate(json.loads(line))
  assert _left_running(env, since) == []


def test_bad_flags_are_one_line_errors(tmp_path):
  for args, expect in (
      (["--systems=tf,pathways"], "pathways"),
      (["--computations=100", "--chain_length=8"], "--computations=100"),
      (["--hosts=1,x"], "--hosts=1,x"),
      (["--hosts=0"], "--hosts=0"),
      (["--crossover", "--crossover_ms=0.3,x"], "--crossover_ms=0.3,x"),
      (["--crossover", "--crossover_ms=0,3"], "--crossover_ms=0,3"),
      (["--crossover", "--systems=tf,ray"], "has no jax; add it, e.g. --systems=tf,ray,jax"),
  ):
    proc = run_cli("tf_tput.micro", *args, f"--results={tmp_path / 'm.jsonl'}")
    assert proc.returncode == 2 and error_lines(proc.stderr) == [proc.stderr.strip()]
    assert expect in proc.stderr


def test_a_system_without_its_extra_is_skipped_and_the_others_run(tmp_path):
  # A `ray` package that fails to import, first on the path: as if the extra were absent.
  fake = tmp_path / "no_ray" / "ray"
  fake.mkdir(parents=True)
  (fake / "__init__.py").write_text("raise ImportError('simulated: ray not installed')\n")
  env = _marked_env()
  env["PYTHONPATH"] = f"{fake.parent}{os.pathsep}{env['PYTHONPATH']}"
  out = tmp_path / "micro.jsonl"
  proc = _micro("--systems=ray,jax", "--modes=opbyop", "--hosts=1", "--chain_length=8",
                "--computations=16", "--repeats=1", f"--results={out}", env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = {r["system"]: r for r in map(json.loads, out.read_text().splitlines())}
  assert records["ray"]["status"] == "skipped" and "pip install" in records["ray"]["error"]
  assert records["jax"]["status"] == "ok"
