"""--system=ray on a Ray cluster of two nodes that was started as a user starts one,
with Ray's own CLI (`ray start --head`, `ray start --address=...`: systems/torch/ray/
nodes.py), and joined through RAY_ADDRESS: one actor per node, torch's arithmetic, the
cluster left as it was found, and a node lost mid-run named in the record. A run that
ends well on such a cluster (tf_tput.launch's, one node per island) is
tests/e2e/test_islands_cli.py's.

As root each node runs in a network namespace of its own, the two joined by a veth
link (runtime/islands.py), so the nodes talk over a link and not over loopback, and
the driver runs in the head's namespace; the nodes are started by the very commands
docs/clusters.md shows for a cluster you own (its token, RAY_AUTH_MODE, `.venv/bin/ray
start`), and its driver command runs unchanged (DocsCluster). Without root both nodes
run on loopback instead (nodes.py, `ray start --block`: the docs' nodes, left running,
are stopped here only with their namespaces), where Ray's multi-node servers listen on
every interface (it refuses multi-node clusters in its loopback-only mode): the
tests' names say which ran. The cluster is started once for the module (10-20 s); the
node-loss test runs last.
"""

import contextlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
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
# decoder_tiny at 16 positions: the quickest steps of 2 actors.
TWO_ACTORS = ["--system=ray", "--num_cpu_devices=2", "--gin_file=decoder_tiny",
              "--gin_param=DataConfig.targets_length=16",
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
experiment = config.load_experiment(["gin/models/decoder_tiny.gin", "gin/mesh/data2.gin"],
                                    ["DataConfig.targets_length = 16"],
                                    systems.options("torch", "ray"))
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


CLUSTERS_DOC = REPO / "docs" / "clusters.md"
DOCS_SECTION = "## ray on a Ray cluster"
# The comment above each of the docs' commands for a cluster you own -> its part here.
DOCS_PARTS = {"once: the cluster's token, readable by you alone (copy it to the others)":
              "token",
              "in every shell below, the driver's too": "exports",
              "on the head node": "head",
              "on every other node": "worker",
              "anywhere that reaches the head, with tf_tput installed": "driver"}


def docs_commands() -> dict:
  """docs/clusters.md's commands for a cluster you own, by DOCS_PARTS' names
  (continuation lines joined)."""
  lines = CLUSTERS_DOC.read_text(encoding="utf-8").splitlines()
  at = next(i for i, line in enumerate(lines) if line.startswith(DOCS_SECTION))
  at = next(i for i in range(at, len(lines)) if lines[i].startswith("    "))
  found, comment = {}, None
  while at < len(lines) and lines[at].startswith("    "):
    text = lines[at].strip()
    if text.startswith("#"):
      comment = text.lstrip("# ")
      found[comment] = ""
    else:  # a line that ends in a backslash goes on in the next
      found[comment] = " ".join(filter(None, [found[comment], text.removesuffix("\\").strip()]))
    at += 1
  assert list(found) == list(DOCS_PARTS), (
      f"docs/clusters.md's commands for a cluster you own are now {list(found)}; say in "
      "DOCS_PARTS (tests/e2e/test_ray_nodes.py) where each runs")
  return {DOCS_PARTS[comment]: command for comment, command in found.items()}


class DocsCluster:
  """Two Ray nodes of 1 CPU started by docs/clusters.md's commands (HEAD, C and N
  filled in), node i in island i of `network`, each command in a bash of its own
  after the docs' exports, in a directory of this test's own: HOME (the token's),
  RAY_TMPDIR (Ray's sessions) and the working directory, its `.venv` this
  interpreter's. `ray start` leaves its node running: the islands' removal stops
  what runs in them, and stop() removes the directory."""

  def __init__(self):
    self.network = None
    self.dir = tempfile.mkdtemp(prefix="tt_docs_")  # short: Ray's socket paths
    os.symlink(pathlib.Path(sys.executable).parent.parent, os.path.join(self.dir, ".venv"))
    self.env = dict(os.environ, HOME=self.dir, RAY_TMPDIR=self.dir, PYTHONPATH=str(REPO),
                    RAY_USAGE_STATS_ENABLED="0", TF_CPP_MIN_LOG_LEVEL="2")
    self.commands, self.head_address = {}, None

  def shell(self, index: int, part: str) -> list:
    """The docs' command `part` as it runs where node `index` does."""
    script = f"{self.commands['exports']}\n{self.commands[part]}"
    return self.exec_prefix(index) + ["bash", "-c", script]

  def start(self, network) -> "DocsCluster":
    self.network, head = network, network.islands[0].address
    fill = {"HEAD": head, "C": "1", "N": "2"}
    self.commands = {part: re.sub(r"\b(HEAD|C|N)\b", lambda m: fill[m.group(1)], command)
                     for part, command in docs_commands().items()}
    self.head_address = re.search(r"RAY_ADDRESS=(\S+)", self.commands["driver"]).group(1)
    for index, part in ((0, "token"), (0, "head"), (1, "worker")):
      done = subprocess.run(self.shell(index, part), cwd=self.dir, env=self.env,
                            capture_output=True, text=True, timeout=120)
      assert done.returncode == 0, f"{self.commands[part]}: {done.stderr[-3000:]}"
    return self

  def stop(self) -> None:
    shutil.rmtree(self.dir, ignore_errors=True)

  def exec_prefix(self, index: int) -> list:
    return self.network.islands[index].exec_prefix()

  def driver_env(self) -> dict:
    """What the docs' exports set (as bash sets it), RAY_ADDRESS and this cluster's
    directory, for a driver started with exec_prefix(0)."""
    names = re.findall(r"(\w+)=", self.commands["exports"])
    printed = subprocess.run(["bash", "-c", f"{self.commands['exports']} && env -0"],
                             env=self.env, capture_output=True, text=True, check=True)
    exported = dict(item.split("=", 1) for item in printed.stdout.split("\0") if "=" in item)
    return {"HOME": self.dir, "RAY_TMPDIR": self.dir, "RAY_ADDRESS": self.head_address,
            **{name: exported[name] for name in names}}

  def pids(self, indices=(0, 1)) -> list:
    """Every process running where the nodes `indices` run."""
    return [int(pid) for index in indices
            for pid in subprocess.run(["ip", "netns", "pids",
                                       self.network.islands[index].namespace],
                                      capture_output=True, text=True).stdout.split()]

  def raylet_pid(self, index: int):
    import psutil
    for pid in self.pids([index]):
      with contextlib.suppress(psutil.Error):
        if psutil.Process(pid).name() == "raylet":
          return pid
    return None


@pytest.fixture(scope="module")
def cluster():
  """Two Ray nodes of 1 CPU each (the docs' in namespaces, nodes.py's on loopback);
  afterwards nothing of them may be left running."""
  from tf_tput.systems.torch.ray import nodes as ray_nodes
  mark, since = process_checks.new_mark(), time.time() - 1.0
  added = {process_checks.MARK: mark, **FAST_HEALTH_CHECKS}
  os.environ.update(added)
  try:
    with contextlib.ExitStack() as stack:
      if IN_NAMESPACES:
        docs = DocsCluster()
        stack.callback(docs.stop)  # once the islands' removal has stopped the nodes
        yield docs.start(stack.enter_context(islands.IslandNetwork(2, None)))
      else:
        yield stack.enter_context(ray_nodes.Nodes(2, 1, None)).start(timeout_s=120)
  finally:
    for name in added:
      del os.environ[name]
  assert process_checks.left_running(since, mark, settle_s=5) == []


def _driver(cluster, *args, env=None) -> subprocess.Popen:
  """python *args where the head runs, with RAY_ADDRESS naming it (and the rest of
  cluster.driver_env(), or `env` instead)."""
  # Ray's variables from the docs' exports only: a Ray started earlier in this pytest
  # process (in-process tests) leaves its own in os.environ (RAY_AUTH_MODE among them).
  inherited = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
  env = dict(inherited, **(cluster.driver_env() if env is None else env),
             TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
  return subprocess.Popen(cluster.exec_prefix(0) + [sys.executable, *args], cwd=REPO,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def _run(cluster, *args, timeout=300, env=None) -> tuple:
  proc = _driver(cluster, *args, env=env)
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
  pids = cluster.pids()
  assert pids
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


@pytest.mark.skipif(not IN_NAMESPACES, reason="the docs' nodes run in network namespaces "
                    "(root): only their removal stops the nodes `ray start` leaves running")
def test_the_docs_driver_command_trains_on_the_nodes_the_docs_commands_started(cluster):
  """docs/clusters.md's driver command as it shows it (N and HEAD filled in), where
  the head runs, after the docs' exports: a run over both nodes, its record where the
  command puts it (results/runs.jsonl of its working directory)."""
  done = subprocess.run(cluster.shell(0, "driver"), cwd=cluster.dir, env=cluster.env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and not error_lines(done.stderr), done.stderr[-3000:]
  [record] = results.read(os.path.join(cluster.dir, "results", "runs.jsonl"))[0]
  assert (record["status"], record["num_nodes"], record["num_devices"]) == ("ok", 2, 2)
  assert sorted(node.split("/")[1] for node in record["nodes"]) == [
      island.address for island in cluster.network.islands]


@pytest.mark.parametrize("where", [WHERE])
def test_a_token_without_ray_auth_mode_stops_the_driver_before_the_run(cluster, tmp_path,
                                                                       where):
  """The token's file named but RAY_AUTH_MODE unset (Ray would send no token): one
  line that says to set it, exit 2, nothing recorded."""
  env = cluster.driver_env()
  del env["RAY_AUTH_MODE"]
  out = tmp_path / "runs.jsonl"
  code, _, err = _run(cluster, "-m", "tf_tput.train", *TWO_ACTORS, f"--results={out}",
                      env=env)
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2 and lines == error_lines(err) and len(lines) == 1, err[-3000:]
  assert "RAY_AUTH_TOKEN_PATH is set but RAY_AUTH_MODE is not" in lines[0], lines[0]
  assert "set RAY_AUTH_MODE=token" in lines[0] and not out.exists()


# What a driver the cluster refuses is told, by the token it has.
REFUSED = {"in_home_without_mode": "RAY_AUTH_MODE is unset, so Ray sent none: set "
                                   "RAY_AUTH_MODE=token",
           "another": "refused the token from RAY_AUTH_TOKEN_PATH="}


@pytest.mark.parametrize("where", [WHERE])
@pytest.mark.parametrize("token", list(REFUSED))
def test_a_driver_the_cluster_refuses_fails_in_one_line_that_says_why(cluster, tmp_path,
                                                                     where, token):
  """The cluster's token in ~/.ray/auth_token (where a local ray.init leaves one) with
  RAY_AUTH_MODE unset, so that Ray sends none; or another token. One error line, not
  Ray's 20 tries and a stack; a failed record."""
  env = cluster.driver_env()
  if token == "another":
    env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "another_token")
    (tmp_path / "another_token").write_text("0" * 64)
  else:
    env["HOME"] = str(tmp_path)
    (tmp_path / ".ray").mkdir()
    shutil.copy(env.pop("RAY_AUTH_TOKEN_PATH"), tmp_path / ".ray" / "auth_token")
    del env["RAY_AUTH_MODE"]
  expect = REFUSED[token]
  out = tmp_path / "runs.jsonl"
  code, _, err = _run(cluster, "-m", "tf_tput.train", *TWO_ACTORS, f"--results={out}",
                      env=env)
  assert code == 1 and "Traceback" not in err, err[-3000:]
  assert "Failed to get cluster ID" not in err and "InvalidAuthToken" not in err, err[-3000:]
  [line] = error_lines(err)
  assert expect in line, line
  [record] = results.read(str(out))[0]
  assert record["status"] == "failed" and expect in record["error"], record["error"]


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
