"""--system=ray on a Ray cluster of two nodes that was started as a user starts one,
with Ray's own CLI (`ray start --head`, `ray start --address=...`: systems/torch/ray/
nodes.py), and joined through RAY_ADDRESS: one actor per node, torch's arithmetic, the
cluster left as it was found, and a node lost mid-run named in the record. A run that
ends well on such a cluster (tf_tput.launch's, one node per island) is
tests/e2e/test_islands_cli.py's.

As root each node runs in a network namespace of its own, the two joined by a veth
link (runtime/islands.py), so the nodes talk over a link and not over loopback, and
the driver runs in the head's namespace. Without root both nodes run on loopback
instead, where Ray's multi-node servers listen on every interface (it refuses
multi-node clusters in its loopback-only mode): the tests' names say which ran.
The cluster is started once for the module (5 s); the node-loss test runs last.
"""

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tf_tput.records import results
from tf_tput.runtime import islands

import process_checks
from cli_helpers import REPO, error_lines

IN_NAMESPACES = islands.missing() is None
# One xdist worker runs them all, on one cluster (tests/conftest.py); on loopback, with
# the other tests that take ports there.
pytestmark = [pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                                     for m in ("ray", "torch")),
                                 reason="the ray extra (ray, torch) is not installed")]
if not IN_NAMESPACES:
  pytestmark.append(pytest.mark.loopback_ports)
WHERE = "in_two_namespaces" if IN_NAMESPACES else "on_loopback_without_root"
TWO_ACTORS = ["--system=ray", "--num_cpu_devices=2", "--gin_file=t5_tiny",
              "--gin_param=MeshConfig.mesh_shape='batch:2'", "--warmup_steps=1"]
# Parity over the cluster (tf_tput.parity's comparison: torch on one device against 2
# actors, from the same weights), then what the run left on the cluster, listed while
# this driver stays connected (its close() must remove its actors and placement group;
# once a job ends Ray removes them itself), and the jobs still running.
PARITY_THEN_LEFTOVERS = """
import json, time, ray
from ray._private import state
from tf_tput import config, parity, systems
from tf_tput.systems.torch.ray import cluster
cluster.Cluster.stop = lambda self: None  # stay connected after close()
experiment = config.load_experiment(["gin/models/t5_tiny.gin", "gin/mesh/data2.gin"],
                                    [], systems.options("torch", "ray"))
rows = parity.compare(parity.parse_sides(["torch", "ray"], experiment), 2, 3)
me = ray.get_runtime_context().get_job_id()
for _ in range(50):  # ray.kill is asynchronous
  left = {
      "actors": [a["ActorID"] for a in state.actors().values()
                 if a["State"] != "DEAD" and a["JobID"] == me],
      "placement_groups": [g for g, info in ray.util.placement_group_table().items()
                           if info["state"] != "REMOVED"],
      "jobs": [j["JobID"] for j in state.jobs() if not j["IsDead"] and j["JobID"] != me],
      "nodes_alive": sum(n["Alive"] for n in ray.nodes())}
  if not left["actors"] and not left["placement_groups"]:
    break
  time.sleep(0.1)
print(json.dumps({"relative_differences": [row[2][1] for row in rows], **left}))
"""


# Ray's GCS declares a node dead after 5 health checks 3 s apart fail; here after 3
# a second apart, so that the node-loss test waits 4 s for it instead of 16.
FAST_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000",
                      "RAY_health_check_failure_threshold": "3"}


@pytest.fixture(scope="module")
def cluster():
  """Two Ray nodes of 1 CPU each; afterwards nothing of them may be left running."""
  from tf_tput.systems.torch.ray import nodes as ray_nodes
  mark, since = process_checks.new_mark(), time.time() - 1.0
  added = {process_checks.MARK: mark, **FAST_HEALTH_CHECKS}
  os.environ.update(added)
  try:
    with contextlib.ExitStack() as stack:
      network = stack.enter_context(islands.IslandNetwork(2, None)) if IN_NAMESPACES else None
      yield stack.enter_context(ray_nodes.Nodes(2, 1, network)).start(timeout_s=120)
  finally:
    for name in added:
      del os.environ[name]
  assert process_checks.left_running(since, mark, settle_s=5) == []


def _driver(cluster, *args, timeout=300) -> subprocess.Popen:
  """python *args where the head runs, with RAY_ADDRESS naming it."""
  env = dict(os.environ, **cluster.driver_env(), TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=str(REPO))
  return subprocess.Popen(cluster.exec_prefix(0) + [sys.executable, *args], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _run(cluster, *args, timeout=300) -> tuple:
  proc = _driver(cluster, *args)
  try:
    out, err = proc.communicate(timeout=timeout)
  finally:
    proc.kill()
  return proc.returncode, out, err


def _check_listening_only_in_the_namespaces(cluster):
  """Ray's servers listen on every interface, of their namespaces only: this
  machine's socket table (psutil reads the caller's namespace) holds none of theirs,
  the head's namespace's does (so the check is not vacuous)."""
  import psutil
  pids = {p.pid for node in cluster.procs
          for p in psutil.Process(node.pid).children(recursive=True)}
  here = [c for c in psutil.net_connections("inet")
          if c.status == psutil.CONN_LISTEN and c.pid in pids]
  assert here == []
  inside = subprocess.run(cluster.exec_prefix(0) + ["ss", "-ltnH"], capture_output=True,
                          text=True, check=True).stdout
  assert "0.0.0.0:" in inside or "*:" in inside, inside


@pytest.mark.parametrize("where", [WHERE])
def test_two_nodes_train_what_one_torch_device_trains_and_leave_nothing_behind(cluster,
                                                                              where):
  if IN_NAMESPACES:
    _check_listening_only_in_the_namespaces(cluster)
  code, out, err = _run(cluster, "-c", PARITY_THEN_LEFTOVERS, timeout=200)
  assert code == 0, err[-3000:]
  found = json.loads(out.splitlines()[-1])
  rels = found.pop("relative_differences")
  assert len(rels) == 3 and rels[0] <= 1e-5 and max(rels) <= 1e-3, rels
  assert found == {"actors": [], "placement_groups": [], "jobs": [], "nodes_alive": 2}


@pytest.mark.parametrize("where", [WHERE])
def test_a_node_that_dies_is_named_in_the_record_within_60_s(cluster, tmp_path, where):
  """Kills node 1's raylet mid-run (the module's last test: the node stays dead)."""
  out = tmp_path / "runs.jsonl"
  proc = _driver(cluster, "-m", "tf_tput.train", *TWO_ACTORS, "--steps=100000",
                 "--log_every=1", f"--results={out}")
  try:
    seen = ""
    while "step 2/" not in seen:
      line = proc.stderr.readline()
      assert line, f"the run ended first: {seen[-3000:]}"
      seen += line
    killed_at = time.monotonic()
    os.kill(cluster.raylet_pid(1), signal.SIGKILL)
    _, err = proc.communicate(timeout=90)
    took = time.monotonic() - killed_at
  finally:
    proc.kill()
  assert proc.returncode == 1 and took < 60, (took, err[-3000:])
  [record] = results.read(str(out))[0]  # one record, of a run over both nodes
  assert record["status"] == "failed" and len(record["losses"]) >= 3
  assert record["num_nodes"] == 2 and record["num_devices"] == 2
  node = next(n for n in record["nodes"] if n.split("/")[2] in record["error"])
  assert f"Ray node {node} died" in record["error"], record["error"]
  if IN_NAMESPACES:
    assert node.split("/")[1] == "198.18.0.2"
  assert any(f"Ray node {node} died" in line for line in error_lines(err))
