"""A TF_CONFIG multi-worker cluster for the TF baseline: checked, joined, watched.

TF's single-controller mode, as the paper's TF baseline ran: the train process is the
cluster's chief. It starts its own tf.distribute.Server (job "chief", task 0) and its
Session on that server is the master that drives, in one graph, a mesh over every
device of the "worker" job. Workers are plain tf.distribute.Server processes
(tf_tput.systems.tensorflow.server; tf_tput.launch --num_workers starts them on loopback).

    TF_CONFIG={"cluster": {"chief": ["127.0.0.1:P0"], "worker": ["127.0.0.1:P1", ...]},
               "task": {"type": "chief", "index": 0}}

TF_CONFIG is checked here, in plain Python and in milliseconds, before TensorFlow
starts; TensorFlow then reads the same variable through TFConfigClusterResolver.
"""

import dataclasses
import json
import socket
import sys
import threading
import time

from tf_tput.errors import UsageError

ENV = "TF_CONFIG"
CHIEF, WORKER = "chief", "worker"
PROBE_TIMEOUT_S = 1.0
POLL_S = 0.2
EXAMPLE = ('{"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}, '
           '"task": {"type": "chief", "index": 0}}')
WORKER_EXAMPLE = EXAMPLE.replace('"type": "chief"', '"type": "worker"')


@dataclasses.dataclass(frozen=True)
class Worker:
  index: int
  address: str           # host:port, as TF_CONFIG names it
  devices: tuple = ()    # full TF device names, once the cluster has listed them

  @property
  def task(self) -> str:
    return f"/job:{WORKER}/replica:0/task:{self.index}"

  def __str__(self) -> str:
    return f"worker {self.index} ({self.address}, {self.task})"


def parse_tf_config(text: str, as_worker: bool = False) -> tuple:
  """(chief address, [Worker]) from TF_CONFIG's text; UsageError naming what is wrong.
  as_worker: the task is one of the workers (it serves the chief; serve_worker)."""
  if not text and as_worker:  # the server module started by hand
    raise UsageError(f"a worker needs {ENV} naming its cluster and its task, e.g. "
                     f"{WORKER_EXAMPLE}")
  if not text:
    raise UsageError(f"--strategy=multi_worker needs {ENV}, e.g. {EXAMPLE}; "
                     "python -m tf_tput.launch --num_workers=N sets it")
  try:
    tf_config = json.loads(text)
  except json.JSONDecodeError as e:
    raise UsageError(f"{ENV} is not valid JSON ({e.msg} at character {e.pos}); "
                     f"write it like {EXAMPLE}") from None
  if not isinstance(tf_config, dict) or not isinstance(tf_config.get("cluster"), dict):
    raise UsageError(f"{ENV}={text!r} has no \"cluster\" object; write it like {EXAMPLE}")
  cluster = tf_config["cluster"]
  for job, least in ((CHIEF, 1), (WORKER, 1)):
    addresses = cluster.get(job)
    if (not isinstance(addresses, list) or len(addresses) < least
        or not all(isinstance(a, str) and _port(a) for a in addresses)):
      raise UsageError(f"{ENV}'s cluster.{job} is {addresses!r}; it must list host:port "
                       f"addresses (one chief, at least one worker), e.g. {EXAMPLE}")
  if len(cluster[CHIEF]) != 1:
    raise UsageError(f"{ENV}'s cluster.chief lists {len(cluster[CHIEF])} addresses; a "
                     "cluster has one chief (the controller)")
  task = tf_config.get("task")
  a_worker = isinstance(task, dict) and task.get("type") == WORKER
  # A worker task whose index is out of range comes here as the chief (its launcher
  # finds no process for it): say what a worker's task must be.
  if ((as_worker or a_worker)
      and not (a_worker and task.get("index") in range(len(cluster[WORKER])))):
    raise UsageError(f"{ENV}'s task is {task!r}; a worker's must be {{\"type\": "
                     f"\"{WORKER}\", \"index\": i}} with i below {len(cluster[WORKER])}")
  if not as_worker and task != {"type": CHIEF, "index": 0}:
    raise UsageError(f"{ENV}'s task is {task!r} but this process drives the run: it must "
                     f"be {{\"type\": \"{CHIEF}\", \"index\": 0}} (a worker task serves "
                     "it: the same command, or python -m tf_tput.systems.tensorflow.server)")
  workers = [Worker(i, address) for i, address in enumerate(cluster[WORKER])]
  return cluster[CHIEF][0], workers


def _port(address: str) -> int:
  host, _, port = address.rpartition(":")
  return int(port) if host and port.isdigit() and 0 < int(port) < 65536 else 0


def _host_port(address: str) -> tuple:
  host, _, port = address.rpartition(":")
  return host.strip("[]"), int(port)


def check_port_free(address: str, named_by: str = f"{ENV}'s") -> None:
  """UsageError when the chief's port is taken: TF would fail to start its server.
  A port whose last server has gone but whose connections linger (TIME_WAIT, as after
  an earlier Slurm step's) is free to TF's server, which reuses addresses; so here."""
  s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    s.bind(("", _port(address)))  # TF's server binds the wildcard address (see server.py)
  except OSError as e:
    raise UsageError(f"{named_by} chief address {address}: port {_port(address)} is in use "
                     f"({e.strerror}); stop what holds it or choose another port") from None
  finally:
    s.close()


def reachable(worker) -> bool:
  """Whether a Worker (or a host:port address) accepts connections."""
  address = worker if isinstance(worker, str) else worker.address
  try:
    socket.create_connection(_host_port(address), PROBE_TIMEOUT_S).close()
    return True
  except OSError:
    return False


def slurm_port_base(job_id) -> int:
  """The first of the ports a Slurm job step's TF tasks listen on, each node's tasks
  from here up by local index (SlurmClusterResolver's port_base): one base per job,
  below Linux's ephemeral ports (32768 up), room for 32 tasks per node."""
  return 10000 + int(job_id or 0) % 600 * 32


# A worker leaves once its chief has refused connections this long: the chief's
# server is gone with its process, whatever its exit code (the launcher reports that).
CHIEF_GONE_S = 2.0


def serve_until_chief_leaves(chief: str, timeout_s: float) -> int:
  """Returns once the chief at `chief` has come and gone (0), or never came within
  timeout_s (1, said in one line): a worker server started by a launcher that waits
  for every task (srun, a Kubernetes job) must end when the run does."""
  deadline, seen, gone_since = time.monotonic() + timeout_s, False, None
  while True:
    if reachable(chief):
      seen, gone_since = True, None
    elif seen:
      gone_since = gone_since or time.monotonic()
      if time.monotonic() - gone_since >= CHIEF_GONE_S:
        return 0
    elif time.monotonic() >= deadline:
      print(f"error: the chief at {chief} did not serve within --cluster_timeout_s="
            f"{timeout_s:g}; start it (the chief task's train command, or task 0 of a "
            "Slurm step) or raise the timeout", file=sys.stderr, flush=True)
      return 1
    time.sleep(POLL_S)


def wait_for_workers(workers: list, timeout_s: float) -> None:
  """Returns once every worker accepts connections; UsageError naming any that did not."""
  deadline = time.monotonic() + timeout_s
  waiting = list(workers)
  while waiting:
    waiting = [w for w in waiting if not reachable(w)]
    if waiting and time.monotonic() >= deadline:
      names = ", ".join(str(w) for w in waiting)
      raise UsageError(f"{names} did not answer within --cluster_timeout_s={timeout_s:g}; "
                       "start the workers (python -m tf_tput.launch --num_workers=N does) "
                       "or raise the timeout")
    if waiting:
      time.sleep(POLL_S)


def unreachable(workers: list, settle_s: float = 0.0) -> list:
  """The workers that refuse connections, watched for up to settle_s until one does:
  a step can fail on a worker's lost connection a moment before its port closes."""
  deadline = time.monotonic() + settle_s
  while True:
    lost = [w for w in workers if not reachable(w)]
    if lost or time.monotonic() >= deadline:
      return lost
    time.sleep(POLL_S)


def with_devices(workers: list, device_names: list) -> list:
  """Each worker with its devices from Session.list_devices(): its GPUs, else its CPUs."""
  out = []
  for w in workers:
    mine = sorted((_kind_index(d), d) for d in device_names
                  if d.startswith(w.task + "/device:"))
    gpus = [d for (kind, _), d in mine if kind == "GPU"]
    chosen = gpus or [d for (kind, _), d in mine if kind == "CPU"]
    if not chosen:
      raise UsageError(f"{w} lists no devices; is it a tf_tput.systems.tensorflow.server of this cluster?")
    out.append(dataclasses.replace(w, devices=tuple(chosen)))
  return out


def _kind_index(device_name: str) -> tuple:
  kind, index = device_name.rsplit("/device:", 1)[1].split(":")
  return kind, int(index)


def close_session(session, wait_s: float) -> None:
  """Closes a Session on a cluster, giving up waiting after wait_s.

  Closing asks the master to clean up on every worker, and gRPC retries a dead
  worker (or a dead master) without end; that wait is left to a daemon thread.
  """
  def close():
    try:
      session.close()
    except Exception:  # noqa: BLE001 - best effort, already failing
      pass

  closer = threading.Thread(target=close, name="tf-session-close", daemon=True)
  closer.start()
  closer.join(wait_s)
