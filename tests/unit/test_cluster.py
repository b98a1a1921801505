"""TF_CONFIG checks, worker device lists and reachability
(tf_tput.systems.tensorflow.cluster)."""

import json
import socket
import threading
import time

import pytest

from tf_tput.records import provenance
from tf_tput.runtime import islands, processes
from tf_tput.errors import UsageError
from tf_tput.systems.tensorflow import cluster, runtime as tf_runtime


def _tf_config(**overrides):
  tf_config = {"cluster": {"chief": ["127.0.0.1:2222"],
                           "worker": ["127.0.0.1:2223", "127.0.0.1:2224"]},
               "task": {"type": "chief", "index": 0}}
  tf_config.update(overrides)
  return json.dumps(tf_config)


def test_workers_count_as_nodes_by_address_those_here_as_they_name_themselves(
    monkeypatch):
  monkeypatch.setattr(provenance, "this_node", lambda: "me/10.0.0.9")
  monkeypatch.setattr(socket, "gethostname", lambda: "me")
  monkeypatch.setenv(islands.NUM_ISLANDS_ENV, "2")
  assert tf_runtime.nodes_of(["127.0.0.1:2223", "127.0.0.1:2224", "[::1]:2225"]) == (
      "me/10.0.0.9",)
  assert tf_runtime.nodes_of(["198.18.0.2:1", "198.18.0.1:2", "198.18.0.1:3"]) == (
      "me/198.18.0.1", "me/198.18.0.2")  # islands here, as this_node() names them inside
  assert tf_runtime.nodes_of(["w1.example:2222", "10.0.0.2:2222", "w1.example:2223"]) == (
      "10.0.0.2", "w1.example")


def test_a_good_tf_config_gives_the_chief_and_the_workers_in_task_order():
  chief, workers = cluster.parse_tf_config(_tf_config())
  assert chief == "127.0.0.1:2222"
  assert [(w.index, w.address, w.task) for w in workers] == [
      (0, "127.0.0.1:2223", "/job:worker/replica:0/task:0"),
      (1, "127.0.0.1:2224", "/job:worker/replica:0/task:1")]
  assert str(workers[1]) == "worker 1 (127.0.0.1:2224, /job:worker/replica:0/task:1)"


@pytest.mark.parametrize("text, expect", [
    ("", "needs TF_CONFIG"),
    ("[1", "not valid JSON"),
    ("[]", 'has no "cluster" object'),
    (_tf_config(cluster={"worker": ["127.0.0.1:2223"]}), "cluster.chief is None"),
    (_tf_config(cluster={"chief": ["a:1", "b:2"], "worker": ["c:3"]}),
     "lists 2 addresses"),
    (_tf_config(cluster={"chief": ["a:1"], "worker": ["c:99999"]}), "cluster.worker is"),
    (_tf_config(task={"type": "chief", "index": 1}), "this process drives the run"),
    (_tf_config(task=None), "task is None"),
])
def test_a_bad_tf_config_names_what_is_wrong(text, expect):
  with pytest.raises(UsageError, match=expect):
    cluster.parse_tf_config(text)


def test_a_worker_task_is_a_worker_to_serve_worker_and_refused_as_the_chief(monkeypatch):
  text = _tf_config(task={"type": "worker", "index": 1})
  chief, workers = cluster.parse_tf_config(text, as_worker=True)
  assert chief == "127.0.0.1:2222" and len(workers) == 2
  with pytest.raises(UsageError, match="this process drives the run"):
    cluster.parse_tf_config(text)
  # serve_worker's own parse, where the workers failed (no TF here: no Slurm).
  monkeypatch.setenv(cluster.ENV, text)
  resolver, chief, workers = tf_runtime._chief_and_workers(every_worker=False,
                                                           as_worker=True)
  assert resolver is None and chief == "127.0.0.1:2222" and len(workers) == 2


@pytest.mark.parametrize("task, as_worker", [
    ({"type": "worker", "index": 2}, True), ({"type": "worker"}, True),
    ({"type": "chief", "index": 0}, True), (None, True),
    ({"type": "worker", "index": 2}, False),  # out of range: no process, so the chief
])
def test_a_workers_task_must_name_a_worker_of_the_cluster(task, as_worker):
  with pytest.raises(UsageError, match=r"a worker's must be .* with i below 2$"):
    cluster.parse_tf_config(_tf_config(task=task), as_worker=as_worker)


def test_a_hand_started_server_checks_its_chief_and_flags_before_tf(monkeypatch):
  from tf_tput.systems.tensorflow import server
  monkeypatch.setenv(cluster.ENV, _tf_config(task={"type": "worker", "index": 0}))
  assert server._chief_to_serve(server._parse_args([])) == "127.0.0.1:2222"
  with pytest.raises(UsageError, match="--cluster_timeout_s=0; it must be > 0"):
    server._chief_to_serve(server._parse_args(["--cluster_timeout_s=0"]))
  monkeypatch.setenv(cluster.ENV, _tf_config())
  with pytest.raises(UsageError, match="a worker's must be"):
    server._chief_to_serve(server._parse_args([]))
  monkeypatch.delenv(cluster.ENV)
  with pytest.raises(UsageError, match='a worker needs TF_CONFIG .*"type": "worker"'):
    server._chief_to_serve(server._parse_args([]))


def test_a_worker_serves_until_its_chief_has_come_and_gone(monkeypatch):
  monkeypatch.setattr(cluster, "CHIEF_GONE_S", 0.3)
  chief = socket.socket()
  chief.bind(("127.0.0.1", 0))
  chief.listen()
  closer = threading.Timer(0.5, chief.close)
  closer.start()
  start = time.monotonic()
  assert cluster.serve_until_chief_leaves(f"127.0.0.1:{chief.getsockname()[1]}", 30) == 0
  assert 0.8 <= time.monotonic() - start < 5
  closer.join()


def test_a_worker_whose_chief_never_serves_exits_1_in_one_line(capsys):
  [port] = processes.free_loopback_ports(1)
  assert cluster.serve_until_chief_leaves(f"127.0.0.1:{port}", 0.3) == 1
  out, err = capsys.readouterr()
  assert out == "" and err.count("\n") == 1 and err.startswith(
      f"error: the chief at 127.0.0.1:{port} did not serve within --cluster_timeout_s=0.3")


def test_workers_get_their_own_devices_gpus_first_in_index_order():
  _, workers = cluster.parse_tf_config(_tf_config())
  listed = ["/job:chief/replica:0/task:0/device:CPU:0",
            "/job:worker/replica:0/task:1/device:CPU:1",
            "/job:worker/replica:0/task:1/device:CPU:0",
            "/job:worker/replica:0/task:0/device:CPU:0",
            "/job:worker/replica:0/task:0/device:GPU:10",
            "/job:worker/replica:0/task:0/device:GPU:2"]
  w0, w1 = cluster.with_devices(workers, listed)
  assert w0.devices == ("/job:worker/replica:0/task:0/device:GPU:2",
                        "/job:worker/replica:0/task:0/device:GPU:10")
  assert w1.devices == ("/job:worker/replica:0/task:1/device:CPU:0",
                        "/job:worker/replica:0/task:1/device:CPU:1")
  with pytest.raises(UsageError, match="worker 1 .* lists no devices"):
    cluster.with_devices(workers, listed[3:])


def test_reachability_follows_a_listening_socket():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  port = server.getsockname()[1]
  worker = cluster.Worker(0, f"127.0.0.1:{port}")
  assert cluster.reachable(worker) and cluster.unreachable([worker]) == []
  cluster.wait_for_workers([worker], timeout_s=1)
  with pytest.raises(UsageError, match="chief address .* is in use"):
    cluster.check_port_free(f"127.0.0.1:{port}")
  server.close()
  assert cluster.unreachable([worker]) == [worker]


def test_waiting_for_a_silent_worker_ends_at_the_timeout():
  [port] = processes.free_loopback_ports(1)
  start = time.monotonic()
  with pytest.raises(UsageError, match=r"worker 0 .* did not answer within "
                                       r"--cluster_timeout_s=0.5"):
    cluster.wait_for_workers([cluster.Worker(0, f"127.0.0.1:{port}")], timeout_s=0.5)
  assert time.monotonic() - start < 3
