"""mtf under TF_CONFIG alone, as a Kubernetes indexed Job runs it: each process is
given only its own TF_CONFIG, the chief drives, and each worker serves it (the same
train command, or the TF server module started by hand) until it has come and gone.

TF's gRPC servers listen on every interface, so each test's processes run inside a
private network namespace with nothing but loopback (runtime.namespaces.PrivateNetwork),
where the cluster's fixed ports are free. After every test no process it started is
left running (tests/conftest.py).
"""

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from tf_tput.records import results
from tf_tput.runtime import namespaces

from cli_helpers import REPO, error_lines

# With the islands' tests, which compare `ip netns list` before and after.
pytestmark = [pytest.mark.usefixtures("no_leftover_processes"),
              pytest.mark.xdist_group("islands"),
              pytest.mark.skipif(namespaces.private_missing() is not None,
                                 reason=str(namespaces.private_missing()))]

CLUSTER = {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]}
# The command every pod of the job runs: decoder_tiny at 16 positions (the quickest
# model) over the two workers' devices.
TRAIN = [sys.executable, "-m", "tf_tput.train", "--system=mtf",
         "--strategy=multi_worker", "--gin_file=decoder_tiny", "--gin_file=data2",
         "--gin_param=DataConfig.targets_length=16", "--steps=2", "--warmup_steps=1"]
SERVER = [sys.executable, "-m", "tf_tput.systems.tensorflow.server"]


class Cluster:
  """Processes started inside one private namespace, each with its TF_CONFIG and its
  output in files; those still running at the end are killed."""

  def __init__(self, net, tmp_path):
    self._net, self._dir, self.procs = net, tmp_path, {}

  def start(self, name: str, command: list, task: dict) -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO),
               TF_CONFIG=json.dumps({"cluster": CLUSTER, "task": task}))
    with open(self._dir / f"{name}.out", "w") as out, \
         open(self._dir / f"{name}.err", "w") as err:
      self.procs[name] = subprocess.Popen(self._net.exec_prefix() + command, cwd=REPO,
                                          env=env, stdout=out, stderr=err)

  def wait(self, name: str, timeout: float) -> int:
    try:
      return self.procs[name].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      raise AssertionError(f"{name} still running after {timeout:g} s: "
                           f"{self.stderr(name)[-3000:]}") from None

  def stdout(self, name: str) -> str:
    return (self._dir / f"{name}.out").read_text()

  def stderr(self, name: str) -> str:
    return (self._dir / f"{name}.err").read_text()

  def kill_all(self) -> None:
    for proc in self.procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _private_cluster(tmp_path):
  with namespaces.PrivateNetwork() as net:
    cluster = Cluster(net, tmp_path)
    try:
      yield cluster
    finally:
      cluster.kill_all()
  assert net.namespace not in namespaces.list_namespaces()


def test_a_chief_drives_workers_that_each_have_only_their_tf_config_then_all_exit(
    tmp_path):
  out = tmp_path / "runs.jsonl"
  with _private_cluster(tmp_path) as cluster:
    cluster.start("chief", [*TRAIN, f"--results={out}"], {"type": "chief", "index": 0})
    # Worker 0 runs the chief's own command, worker 1 the server module by hand.
    cluster.start("worker0", [*TRAIN, f"--results={out}"], {"type": "worker", "index": 0})
    cluster.start("worker1", SERVER, {"type": "worker", "index": 1})
    assert cluster.wait("chief", 300) == 0, cluster.stderr("chief")[-3000:]
    chief_done = time.monotonic()
    for worker in ("worker0", "worker1"):
      assert cluster.wait(worker, 30) == 0, cluster.stderr(worker)[-3000:]
      assert "serving grpc://127.0.0.1:222" in cluster.stdout(worker)
    assert time.monotonic() - chief_done < 30
  [record] = results.read(str(out))[0]  # the chief's alone
  assert record["status"] == "ok" and record["launcher"] == "tf_config"
  assert record["strategy"] == "multi_worker" and record["num_devices"] == 2
  workers = record["env"]["accelerators"]
  assert [(w["task"], w["address"], w["count"]) for w in workers] == [
      ("/job:worker/replica:0/task:0", "127.0.0.1:2223", 1),
      ("/job:worker/replica:0/task:1", "127.0.0.1:2224", 1)]


@pytest.mark.parametrize("command", [TRAIN, SERVER], ids=["train", "server"])
def test_a_worker_whose_chief_never_serves_exits_1_in_one_line(command, tmp_path):
  with _private_cluster(tmp_path) as cluster:
    cluster.start("worker", [*command, "--cluster_timeout_s=1"],
                  {"type": "worker", "index": 0})
    assert cluster.wait("worker", 120) == 1, cluster.stderr("worker")[-3000:]
    stderr = cluster.stderr("worker")
  assert "Traceback" not in stderr
  assert error_lines(stderr) == ["error: the chief at 127.0.0.1:2222 did not serve within "
                                 "--cluster_timeout_s=1; start it (the chief task's train "
                                 "command, or task 0 of a Slurm step) or raise the timeout"]
