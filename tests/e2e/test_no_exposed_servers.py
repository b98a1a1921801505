"""Nothing a run starts listens where other machines can reach it.

TensorFlow's gRPC servers listen on every interface whatever address they are given,
so tf_tput.launch --num_workers and tf_tput.micro start them, and every process that
talks to them, inside a private network namespace with nothing but loopback
(runtime.namespaces.PrivateNetwork), removed however the run ends. `--expose_servers`
starts them in this machine's network, as before; without root (or iproute2) both
entry points refuse in one line naming that flag. The socket checks read this
machine's own socket table (psutil.net_connections: the test's namespace), and, to
show they are not vacuous, the namespace's own table, where the servers do listen on
every interface of a namespace that has only `lo`.
"""

import dataclasses
import ipaddress
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tf_tput.errors import UsageError
from tf_tput.runtime import namespaces

from cli_helpers import REPO, Launched, error_lines, run_cli

needs_namespaces = pytest.mark.skipif(namespaces.private_missing() is not None,
                                      reason=str(namespaces.private_missing()))
# With the islands' tests, which compare `ip netns list` before and after.
pytestmark = [pytest.mark.usefixtures("no_leftover_processes"),
              pytest.mark.xdist_group("islands")]

TRAIN = ["--", sys.executable, "-m", "tf_tput.train", "--system=mtf",
         "--strategy=multi_worker", "--gin_file=gin/models/decoder_tiny.gin",
         "--gin_file=gin/mesh/data2.gin",
         "--gin_param=TrainConfig.global_batch = 4", "--warmup_steps=1"]
LAUNCH_2X1 = ["--num_workers=2", "--devices_per_worker=1", "--grace_s=2"]
HOST_NETNS = os.readlink("/proc/self/ns/net")

# A stand-in for a command: connects to every worker of its TF_CONFIG ("connect"),
# says on stderr where it runs, then ends or waits ("wait").
WHERE = r"""
import json, os, socket, sys, time
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
for address in cluster["worker"] if sys.argv[1] != "none" else []:
  host, port = address.rsplit(":", 1)
  socket.create_connection((host, int(port)), timeout=5).close()
# One write per line: print() writes the text and its newline apart, and the copies
# share one stderr, so two lines could run together.
sys.stderr.write("where " + json.dumps({
    "netns": os.readlink("/proc/self/ns/net"),
    "interfaces": sorted(n for _, n in socket.if_nameindex()),
    "islands": os.environ.get("TF_TPUT_NUM_ISLANDS")}) + "\n")
sys.stderr.flush()
if sys.argv[1] == "wait":
  time.sleep(600)
"""

# Runs an entry point as if this process were not root (os.geteuid says 1000).
AS_NOT_ROOT = ("import os, runpy, sys\nos.geteuid = lambda: 1000\n"
               "sys.argv = sys.argv[1:]\n"
               "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")


def _exposed(root_pid: int) -> list:
  """Sockets of this machine's own network namespace that root_pid or a descendant
  listens on at an address other than loopback."""
  pids = {root_pid} | {p.pid for p in psutil.Process(root_pid).children(recursive=True)}
  return [f"{c.laddr.ip}:{c.laddr.port} (pid {c.pid})"
          for c in psutil.net_connections(kind="tcp")
          if c.status == psutil.CONN_LISTEN and c.pid in pids
          and not ipaddress.ip_address(c.laddr.ip).is_loopback]


def _listening_inside(pid: int) -> list:
  """(hex address, port) of every TCP socket listening in pid's network namespace."""
  found = []
  for table in ("tcp", "tcp6"):
    try:
      lines = pathlib.Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
    except OSError:
      continue
    for fields in (line.split() for line in lines):
      if fields[3] == "0A":  # TCP_LISTEN
        address, port = fields[1].split(":")
        found.append((address, int(port, 16)))
  return found


def _interfaces(pid: int) -> list:
  lines = pathlib.Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
  return sorted(line.split(":")[0].strip() for line in lines)


def _namespaces_of(pid: int) -> list:
  return [n for n in namespaces.list_namespaces() if n.startswith(f"tt{pid}")]


def _tf_tasks(root_pid: int, timeout: float = 120) -> list:
  """The descendants that have a TF_CONFIG, once each listens (in its namespace)."""
  deadline = time.monotonic() + timeout
  while True:
    tasks = [p for p in psutil.Process(root_pid).children(recursive=True)
             if "TF_CONFIG" in _environ(p)]
    listening = {port for p in tasks for _, port in _listening_inside(p.pid)}
    if tasks and len(listening) >= len(tasks) or time.monotonic() > deadline:
      return tasks
    time.sleep(0.2)


def _environ(process) -> dict:
  try:
    return process.environ()
  except psutil.Error:  # it ended meanwhile
    return {}


def _where(lines) -> list:
  return [json.loads(line.split("where ", 1)[1]) for line in lines
          if line.startswith("where ")]


@needs_namespaces
def test_a_two_worker_mtf_run_listens_only_inside_its_private_namespace(tmp_path):
  launched = Launched([*LAUNCH_2X1, *TRAIN, "--steps=100000", "--log_every=1",
                       f"--results={tmp_path / 'runs.jsonl'}"])
  launched.wait_for("step 2/")
  pid = launched.proc.pid
  tasks = _tf_tasks(pid)  # the 2 workers and the chief (the train command)
  assert len(tasks) == 3
  spaces = {os.readlink(f"/proc/{p.pid}/ns/net") for p in tasks}
  assert len(spaces) == 1 and HOST_NETNS not in spaces
  assert _interfaces(tasks[0].pid) == ["lo"]
  inside = _listening_inside(tasks[0].pid)
  # Not vacuous: in there every server listens on every interface (0.0.0.0 or ::).
  assert len(inside) == 3 and all(set(address) == {"0"} for address, _ in inside), inside
  assert _exposed(pid) == []
  assert _namespaces_of(pid) == [f"tt{pid}lo"]
  launched.proc.send_signal(signal.SIGINT)
  stderr = launched.finish(timeout=60)
  assert launched.proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
  assert _namespaces_of(pid) == []


@needs_namespaces
def test_every_copy_of_a_tf2_program_shares_one_private_namespace():
  proc = run_cli("tf_tput.launch", "--num_workers=2", "--", sys.executable, "-c", WHERE,
                 "none", "--system=tf2", timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  where = _where(proc.stderr.splitlines())
  assert len(where) == 2 and where[0]["netns"] == where[1]["netns"] != HOST_NETNS
  assert where[0]["interfaces"] == ["lo"]


@needs_namespaces
def test_one_island_runs_in_a_private_namespace_that_a_killed_launcher_leaves_not():
  launched = Launched(["--islands=1", "--num_workers=1", "--grace_s=2", "--",
                       sys.executable, "-c", WHERE, "wait", "--system=mtf"])
  launched.wait_for("where ")  # the chief reached its worker inside the namespace
  pid = launched.proc.pid
  [where] = _where(launched.lines)
  assert where["netns"] != HOST_NETNS and where["interfaces"] == ["lo"]
  assert where["islands"] == "1"  # the baseline keeps its island axis
  assert _exposed(pid) == []
  assert _namespaces_of(pid) == [f"tt{pid}lo"]
  launched.proc.kill()  # no handler runs: the reaper removes the namespace
  launched.finish(timeout=30)
  deadline = time.monotonic() + 20
  while _namespaces_of(pid) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert _namespaces_of(pid) == []


@pytest.mark.loopback_ports  # its worker binds a port of this machine's loopback
def test_expose_servers_starts_the_cluster_in_this_machines_network():
  proc = run_cli("tf_tput.launch", "--expose_servers", "--num_workers=1", "--grace_s=2",
                 "--", sys.executable, "-c", WHERE, "connect", "--system=mtf",
                 timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  [where] = _where(proc.stderr.splitlines())
  assert where["netns"] == HOST_NETNS


@needs_namespaces
def test_the_micro_benchmarks_tf_servers_and_client_share_a_private_namespace():
  micro_run = Launched(["--systems=tf", "--modes=opbyop", "--hosts=2",
                        "--devices_per_host=1", "--chain_length=1",
                        "--computations=100000", "--repeats=50", "--timeout_s=300",
                        "--results=/dev/null"], module="tf_tput.micro")
  micro_run.wait_for("tf opbyop, 2 host(s)")
  pid = micro_run.proc.pid
  servers = _tf_tasks(pid)
  assert len(servers) == 2
  client = [p for p in psutil.Process(pid).children(recursive=True)
            if "tf_tput.micro.tf_single" in p.cmdline()]
  assert len(client) == 1
  spaces = {os.readlink(f"/proc/{p.pid}/ns/net") for p in servers + client}
  assert len(spaces) == 1 and HOST_NETNS not in spaces
  assert len(_listening_inside(servers[0].pid)) == 2
  assert _exposed(pid) == []
  micro_run.proc.send_signal(signal.SIGINT)
  stderr = micro_run.finish(timeout=60)
  assert micro_run.proc.returncode == 130, stderr[-3000:]
  assert _namespaces_of(pid) == []


@needs_namespaces
def test_one_private_client_serves_runs_until_one_fails_which_raises_its_error_here():
  from tf_tput import micro
  from tf_tput.micro import tf_single
  spec = micro.Spec("tf", "opbyop", hosts=1, devices_per_host=1, computations=8,
                    repeats=1, timeout_s=60)
  clients = []
  try:
    for mode in ("opbyop", "fused"):
      assert len(tf_single.run_private(dataclasses.replace(spec, mode=mode,
                                                           chain_length=8))) == 1
      clients.append(tf_single._client._proc.pid)
    assert clients[0] == clients[1]  # one client (one TF import) for both runs
    with pytest.raises(TimeoutError, match="timeout_s"):  # its type kept
      tf_single.run_private(dataclasses.replace(spec, timeout_s=0.05))
    assert tf_single._client is None  # a failed run stops the client
  finally:
    tf_single.close()
  assert _namespaces_of(os.getpid()) == [] and not psutil.pid_exists(clients[0])


@pytest.mark.parametrize("launch", [
    ["--num_workers=2", "--", sys.executable, "-c", "pass", "--system=mtf"],
    ["--num_workers=2", "--islands=1", "--", sys.executable, "-c", "pass", "--system=mtf"],
    ["--num_workers=2", "--", sys.executable, "-c", "pass", "--system=tf2"],
], ids=["mtf", "mtf-one-island", "tf2"])
def test_without_root_the_launcher_refuses_in_one_line_naming_the_flag(launch):
  proc = _as_not_root("tf_tput.launch", *launch)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert error_lines(proc.stderr) == [proc.stderr.strip()]
  assert "need root" in proc.stderr and "--expose_servers" in proc.stderr


def test_without_root_the_micro_benchmark_refuses_tf_in_one_line(tmp_path):
  out = tmp_path / "micro.jsonl"
  proc = _as_not_root("tf_tput.micro", "--systems=jax,tf", f"--results={out}")
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert error_lines(proc.stderr) == [proc.stderr.strip()]
  assert "--systems=tf:" in proc.stderr and "--expose_servers" in proc.stderr
  assert not out.exists()


def _as_not_root(module: str, *args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  return subprocess.run([sys.executable, "-c", AS_NOT_ROOT, module, *args], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=60)


def test_what_a_private_namespace_needs(monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  assert "need root (this process runs as uid 1000)" in namespaces.private_missing()
  with pytest.raises(UsageError, match="need root"):
    with namespaces.PrivateNetwork():
      pass
  monkeypatch.setattr(os, "geteuid", lambda: 0)
  monkeypatch.setattr(shutil, "which", lambda tool: None)
  assert "iproute2's 'ip'" in namespaces.private_missing()
