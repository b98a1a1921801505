"""tf_tput.launch --islands: JAX processes (or mtf's TF workers and chief) inside
network namespaces joined by shaped links; every namespace removed however the launch
ends. Needs root and iproute2."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tf_tput.records import provenance, results
from tf_tput.runtime import islands

from cli_helpers import REPO, error_lines, run_cli
from process_checks import namespaces_left

pytestmark = [pytest.mark.skipif(islands.missing() is not None,
                                 reason=str(islands.missing())),
              pytest.mark.usefixtures("no_leftover_processes"),
              pytest.mark.xdist_group("islands")]  # shaped links, timed

# Each child checks where it is, then behaves as its process id says.
CHILD = r"""
import os, signal, socket, sys, time
if sys.argv[1] == "stubborn":  # as a JAX process does: jax.distributed takes SIGTERM
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
index = int(os.environ["TF_TPUT_PROCESS_ID"])
island = int(os.environ["TF_TPUT_ISLAND"])
assert island == index * 2 // 4 and os.environ["TF_TPUT_NUM_ISLANDS"] == "2"
assert os.environ["TF_TPUT_COORDINATOR"].startswith("198.18.0.1:")
assert socket.gethostbyname(socket.gethostname()) == f"198.18.0.{island + 1}"
sys.stdout.write(f"up {index}\n"); sys.stdout.flush()  # one write: 4 share the pipe
if sys.argv[1] == "die" and index == 3:
  time.sleep(1)
  os.kill(os.getpid(), 9)
if sys.argv[1] != "ok":
  time.sleep(600)
"""


def _launch(behaviour: str) -> list:
  return [sys.executable, "-m", "tf_tput.launch", "--islands=2", "--num_processes=4",
          "--", sys.executable, "-c", CHILD, behaviour]


def test_processes_run_in_their_islands_and_the_namespaces_go():
  proc = run_cli("tf_tput.launch", "--islands=2", "--dcn_rate=100mbit",
                 "--num_processes=4", "--", sys.executable, "-c", CHILD, "ok", timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert namespaces_left() == []


def test_a_process_killed_in_one_island_stops_all_within_30_s():
  start = time.monotonic()
  proc = run_cli("tf_tput.launch", "--islands=2", "--num_processes=4", "--",
                 sys.executable, "-c", CHILD, "die", timeout=120)
  assert time.monotonic() - start < 30
  assert proc.returncode == 1
  assert error_lines(proc.stderr) == [
      f"error: process 3 (pid {_pid_of(proc.stderr)}) in island 1 was killed by signal 9; "
      "stopped the other 3"]
  assert namespaces_left() == []


def test_tf_workers_in_islands_stop_and_the_namespaces_go_when_the_chief_fails():
  """The chief (here a command that checks its island, then fails) in island 0, the
  workers serving in theirs: the launcher stops them all, exits with its code."""
  chief = ("import json, os, socket, sys\n"
           "spec = json.loads(os.environ['TF_CONFIG'])['cluster']\n"
           "assert spec['chief'][0].startswith('198.18.0.1:'), spec\n"
           "assert [w.split(':')[0] for w in spec['worker']] == ['198.18.0.1', "
           "'198.18.0.2'], spec\n"
           "socket.create_connection(spec['worker'][1].split(':'), timeout=5).close()\n"
           "sys.exit(3)\n")
  start = time.monotonic()
  proc = run_cli("tf_tput.launch", "--islands=2", "--num_workers=2", "--grace_s=2", "--",
                 sys.executable, "-c", chief, timeout=120)
  assert time.monotonic() - start < 60
  assert proc.returncode == 3, proc.stderr[-2000:]
  assert "exited with code 3" in error_lines(proc.stderr)[-1]
  assert namespaces_left() == []


def _pid_of(stderr: str) -> str:
  return stderr.split("(pid ", 1)[1].split(")", 1)[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_launcher_leaves_no_namespace(sig):
  env = dict(os.environ, PYTHONPATH=str(REPO))
  # Killed outright, the launcher cannot escalate to SIGKILL: its children must die
  # with it even when they ignore SIGTERM (no_leftover_processes checks).
  behaviour = "stubborn" if sig == signal.SIGKILL else "wait"
  launcher = subprocess.Popen(_launch(behaviour), cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    for _ in range(4):
      assert launcher.stdout.readline().startswith("up")
    launcher.send_signal(sig)
    launcher.wait(timeout=30)
    deadline = time.monotonic() + 20  # after SIGKILL the reaper and the children act
    while namespaces_left(launcher.pid) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert namespaces_left(launcher.pid) == []
    if sig != signal.SIGKILL:
      assert launcher.returncode == 128 + sig
  finally:
    launcher.kill()
    launcher.wait()


def test_jax_trains_across_two_islands_and_counts_the_bytes_between_them(tmp_path):
  """2 islands x 1 process x 2 devices: the gradient is reduced within each island,
  one copy per island crosses, and the links' counters agree with the analytic bytes.
  jax.devices() lists the processes' devices process-major, so each process's two are
  its island's row; the same reduction on 2 x 2 devices of one process is
  tests/unit/test_jax_islands.py's."""
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.launch", "--islands=2", "--dcn_rate=1gbit", "--num_processes=2",
                 "--", sys.executable, "-m", "tf_tput.train", "--system=jax",
                 "--gin_file=gin/models/decoder_tiny.gin",
                 "--gin_param=MeshConfig.mesh_shape = 'batch:4'", "--num_cpu_devices=2",
                 "--steps=4", "--warmup_steps=1", f"--results={out}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  results.validate(record)
  assert record["status"] == "ok" and record["num_processes"] == 2
  assert (record["islands"], record["devices_per_island"], record["dcn_rate"]) == (
      2, 2, "1gbit")
  _check_two_island_nodes(record)
  analytic = record["link_bytes_per_step_analytic"]
  assert analytic == 2 * 4 * record["num_params"]  # 2(K-1) float32 gradients
  assert abs(record["link_bytes_per_step"] - analytic) <= 0.15 * analytic


@pytest.mark.parametrize("system, launch, train", [
    ("torch", ["--num_processes=2"], []), ("ray", [], ["--num_cpu_devices=2"])],
    ids=["torch", "ray"])
def test_torch_and_ray_train_across_two_islands_and_count_the_bytes(tmp_path, system,
                                                                    launch, train):
  """One torch process, or one Ray node holding one actor, per island (ray's driver in
  island 0 with the head): gloo's ring crosses the link once each way, and for ray
  the batch too; the counters agree with the analytic bytes within 10%."""
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.launch", "--islands=2", "--dcn_rate=1gbit", *launch, "--",
                 sys.executable, "-m", "tf_tput.train", f"--system={system}", *train,
                 "--gin_file=gin/models/decoder_tiny.gin",
                 "--gin_param=DataConfig.targets_length = 16",
                 "--gin_param=MeshConfig.mesh_shape = 'batch:2'", "--steps=4",
                 "--warmup_steps=1", f"--results={out}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  results.validate(record)
  assert record["status"] == "ok" and record["num_devices"] == 2
  assert (record["islands"], record["devices_per_island"], record["dcn_rate"]) == (
      2, 1, "1gbit")
  assert [n.rsplit("/", 1)[0] if system == "ray" else n for n in record["nodes"]] == [
      provenance.node_at(f"198.18.0.{k}") for k in (1, 2)]  # ray's add the node id
  analytic = record["link_bytes_per_step_analytic"]
  assert analytic >= 2 * 4 * record["num_params"]  # one gradient each way, at least
  assert abs(record["link_bytes_per_step"] - analytic) <= 0.1 * analytic


def _check_two_island_nodes(record):
  """Each island a node: this machine at the island's address."""
  assert record["num_nodes"] == 2
  assert record["nodes"] == [provenance.node_at(f"198.18.0.{k}") for k in (1, 2)]


# Data parallel only: the model-axis groups' reduction is unit-tested
# (test_mtf_islands.py); a 'batch:2;model:2' launch here (it passed) costs about 45 s.
def test_mtf_trains_across_two_islands_as_on_one_host_and_counts_the_bytes(tmp_path):
  """2 islands x 1 TF worker x 2 devices, the chief in island 0: the hierarchical
  reduction trains what one process's 4 devices train, and the links' counters agree
  with 2(K-1) times what the mesh all-reduces across them."""
  out, local = tmp_path / "runs.jsonl", tmp_path / "local.jsonl"
  train = [sys.executable, "-m", "tf_tput.train", "--system=mtf",
           "--gin_file=gin/models/decoder_tiny.gin",
           "--gin_param=MeshConfig.mesh_shape = 'batch:4'",
           "--steps=4", "--warmup_steps=1"]
  proc = run_cli("tf_tput.launch", "--islands=2", "--dcn_rate=1gbit", "--num_workers=2",
                 "--devices_per_worker=2", "--", *train, "--strategy=multi_worker",
                 f"--results={out}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  results.validate(record)
  assert record["status"] == "ok" and record["strategy"] == "multi_worker"
  assert (record["islands"], record["devices_per_island"], record["dcn_rate"]) == (
      2, 2, "1gbit")
  assert [w["address"].split(":")[0] for w in record["env"]["accelerators"]] == [
      "198.18.0.1", "198.18.0.2"]
  _check_two_island_nodes(record)
  analytic = record["link_bytes_per_step_analytic"]
  # mtf reduces the relative bias's [length, memory, heads] gradient: more than params.
  assert analytic > 2 * 4 * record["num_params"]
  assert abs(record["link_bytes_per_step"] - analytic) <= 0.15 * analytic
  proc = run_cli(*train[2:], "--num_cpu_devices=4", f"--results={local}", timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  same = json.loads(local.read_text())
  assert same["nodes"] == [provenance.this_node()] and same["num_nodes"] == 1
  for a, b in zip(record["losses"], same["losses"], strict=True):
    assert abs(a - b) / b < 1e-5


PIPELINE_TRAIN = ["-m", "tf_tput.train", "--gin_file=gin/models/decoder_tiny.gin",
                  "--gin_file=gin/pipeline/s2_m8.gin",
                  "--gin_param=TrainConfig.global_batch = 8", "--steps=4",
                  "--warmup_steps=1"]


@pytest.mark.parametrize("system", ["jax", "mtf"])
def test_a_pipeline_across_two_islands_sends_its_stage_boundaries_over_the_link(
    system, tmp_path):
  """2 stages x 8 micro-batches, one stage per island (a JAX process or a TF worker
  of one device each): the links' counters agree with the bytes the schedule sends
  (each micro-batch's activations forward, their gradients back, the shared
  embedding's gradient or copy), and jax trains what one process's 2 devices train."""
  out, local = tmp_path / "runs.jsonl", tmp_path / "local.jsonl"
  launch = (["--num_processes=2"] if system == "jax"
            else ["--num_workers=2", "--devices_per_worker=1"])
  train = [f"--system={system}", "--num_cpu_devices=1" if system == "jax"
           else "--strategy=multi_worker", f"--results={out}"]
  proc = run_cli("tf_tput.launch", "--islands=2", "--dcn_rate=1gbit", *launch, "--",
                 sys.executable, *PIPELINE_TRAIN, *train, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  results.validate(record)
  assert record["status"] == "ok" and record["pipeline_stages"] == 2
  assert (record["islands"], record["devices_per_island"]) == (2, 1)
  _check_two_island_nodes(record)
  analytic = record["link_bytes_per_step_analytic"]
  boundary, embedding = 1 * 128 * 64 * 4, 512 * 64 * 4  # a micro-batch; the vocabulary
  assert analytic > 2 * 8 * boundary + 2 * embedding
  assert abs(record["link_bytes_per_step"] - analytic) <= 0.15 * analytic
  if system == "jax":
    proc = run_cli(*PIPELINE_TRAIN[1:], "--system=jax", "--num_cpu_devices=2",
                   f"--results={local}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    same = json.loads(local.read_text())
    for a, b in zip(record["losses"], same["losses"], strict=True):
      assert abs(a - b) / b < 1e-5


def test_a_model_parallel_mesh_across_islands_is_one_line_for_jax(tmp_path):
  proc = run_cli("tf_tput.launch", "--islands=2", "--num_processes=2", "--",
                 sys.executable, "-m", "tf_tput.train", "--system=jax",
                 "--gin_file=gin/models/decoder_tiny.gin", "--num_cpu_devices=2",
                 "--gin_file=gin/mesh/data2_model2.gin", f"--results={tmp_path / 'r'}",
                 timeout=120)
  assert proc.returncode != 0 and not (tmp_path / "r").exists()
  assert "islands are data parallel inside too, but axes {'model': 2}" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--islands=2", "--num_processes=3"], "--islands=2 with --num_processes=3: give "
     "islands that divide"),
    (["--islands=1", "--num_processes=2", "--dcn_rate=1gbit"],
     "one island has no link between islands"),
    (["--islands=2", "--num_processes=2", "--dcn_rate=fast"],
     "--dcn_rate='fast' is not a rate"),
    (["--num_processes=2", "--dcn_rate=1gbit"], "add --islands=K"),
    (["--islands=2", "--num_workers=3"], "--islands=2 with --num_workers=3: give "
     "islands that divide the workers"),
    (["--islands=2", "--num_workers=2", "--port=23000"], "drop --port"),
])
def test_bad_island_flags_are_one_line(args, message):
  proc = run_cli("tf_tput.launch", *args, "--", sys.executable, "-c", "pass", timeout=60)
  assert proc.returncode == 2
  lines = error_lines(proc.stderr)
  assert len(lines) == 1 and message in lines[0]
  assert namespaces_left() == []


def test_tf2_workers_across_islands_are_one_line():
  proc = run_cli("tf_tput.launch", "--islands=2", "--num_workers=2", "--",
                 sys.executable, "-m", "tf_tput.train", "--system=tf2", timeout=60)
  assert proc.returncode == 2
  lines = error_lines(proc.stderr)
  assert len(lines) == 1 and ("--system=tf2 does not train across islands as worker "
                              "servers") in lines[0]
