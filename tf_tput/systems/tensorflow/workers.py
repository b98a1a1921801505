"""TF worker processes on loopback (or in islands): started, awaited, described when
they die, stopped.

TensorFlow's gRPC servers listen on every interface (server.py). Unless told to
expose them (--expose_servers), tf_tput.launch passes a runtime.namespaces.PrivateNetwork,
a namespace with nothing but loopback, and every task starts inside it: the workers
and what talks to them (the chief, or every worker's copy of the program); the
micro-benchmark runs its client and servers inside one (tf_single.run_private).
Across islands each task starts in its island's namespace instead.

Shared by tf_tput.launch --num_workers (the chief is the launched command) and the TF
micro-benchmark (its client drives worker 0 as master). Each worker is a
tf_tput.systems.tensorflow.server process in its own session, told its task through TF_CONFIG, with
its output in a log file whose end is quoted when it fails.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import tf_tput
from tf_tput.runtime import processes
from tf_tput.systems.tensorflow import cluster
from tf_tput.systems.tensorflow.server import READY_MARKER, STARTUP_NOISE

SERVER_MODULE = "tf_tput.systems.tensorflow.server"
WORKER_LOSS_GRACE_S = 30.0     # how long the chief gets to notice a lost worker
UNBOUNDED_LIFETIME_S = 7 * 24 * 3600.0  # workers still exit with their launcher
LOG_TAIL_LINES = 10


# Logical CPU devices each worker of launch_every_worker configures for itself.
DEVICES_ENV = "TF_TPUT_DEVICES_PER_WORKER"


def loopback_cluster(num_workers: int, with_chief: bool, ports=None) -> dict:
  """A cluster spec on 127.0.0.1: free ports, or `ports` (chief first) when given."""
  count = num_workers + int(with_chief)
  ports = list(ports) if ports is not None else processes.free_loopback_ports(count)
  addresses = [f"127.0.0.1:{port}" for port in ports]
  spec = {cluster.WORKER: addresses[int(with_chief):]}
  if with_chief:
    spec[cluster.CHIEF] = addresses[:1]
  return spec


# Inside islands every task gets its own port from here up, chief first: the
# namespaces are new, so nothing else listens in them.
ISLAND_BASE_PORT = 20000


def island_cluster(num_workers: int, network) -> dict:
  """A cluster spec across the islands of `network` (a runtime.islands.IslandNetwork):
  the chief in island 0, the workers split into the islands in task order, each task
  on its island's address."""
  def address(island, task):
    return f"{island.address}:{ISLAND_BASE_PORT + task}"
  return {cluster.CHIEF: [address(network.islands[0], 0)],
          cluster.WORKER: [address(network.island_of(i, num_workers), i + 1)
                           for i in range(num_workers)]}


def tf_config(spec: dict, job: str, index: int) -> str:
  return json.dumps({"cluster": spec, "task": {"type": job, "index": index}})


def exec_prefix(network, task: int, count: int) -> list:
  """What starts task `task` of `count` where it runs: in its island (network a
  runtime.islands.IslandNetwork), in the one private namespace (a PrivateNetwork, no
  islands), or here (None)."""
  if network is None:
    return []
  if network.islands:
    return network.island_of(task, count).exec_prefix()
  return network.exec_prefix()


class WorkerProcesses:
  """The "worker" job of `spec`: one tf_server per address, each with `devices` CPUs."""

  def __init__(self, spec: dict, devices: int, log_dir: str, lifetime_s: float,
               die_with_parent: bool = False, network=None):
    self.spec = spec
    self._network = network  # runtime.islands: start each where exec_prefix() says
    self.addresses = spec[cluster.WORKER]
    self._devices = devices
    self._log_dir = log_dir
    self._lifetime_s = lifetime_s
    self._die_with_parent = die_with_parent
    self.procs = []

  def _log_path(self, task: int) -> str:
    return os.path.join(self._log_dir, f"worker{task}.log")

  def start(self) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tf_tput.REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for task in range(len(self.addresses)):
      env[cluster.ENV] = tf_config(self.spec, cluster.WORKER, task)
      command = [sys.executable, "-m", SERVER_MODULE, f"--devices={self._devices}",
                 f"--lifetime_s={self._lifetime_s:.0f}"]
      command = exec_prefix(self._network, task, len(self.addresses)) + command
      with open(self._log_path(task), "wb") as log:
        self.procs.append(processes.popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, die_with_parent=self._die_with_parent))

  def wait_until_serving(self, deadline: float, timeout_text: str,
                         interrupted=lambda: False) -> None:
    """Returns once every worker serves; RuntimeError when one dies, TimeoutError at
    the deadline (its message ends with timeout_text), KeyboardInterrupt when asked."""
    processes.wait_for_marker(
        self, {task: self._log_path(task) for task in range(len(self.addresses))},
        READY_MARKER, deadline, lambda waiting: "worker(s) " + ", ".join(
            f"{t} ({self.addresses[t]})" for t in waiting) + " were not serving within "
        + timeout_text, interrupted)

  def exited(self) -> list:
    """(task, exit code) of each worker that is no longer running."""
    return [(task, p.poll()) for task, p in enumerate(self.procs) if p.poll() is not None]

  def describe(self, task_and_code) -> str:
    task, code = task_and_code
    tail = processes.log_tail(self._log_path(task), LOG_TAIL_LINES,
                              "(nothing but TF start-up notices)", STARTUP_NOISE)
    return (f"worker {task} (pid {self.procs[task].pid}, {self.addresses[task]}) "
            f"{processes.how(code)}; its log ends: {tail}")

  def stop(self, grace_s: float) -> None:
    """SIGTERM to every worker's process group, SIGKILL to any left after the grace."""
    processes.stop(self.procs, grace_s)


def launch_every_worker(command: list, num_workers: int, devices_per_worker: int,
                        grace_s: float, timeout_s: float = None, ports=None,
                        network=None) -> int:
  """N copies of `command`, worker i with TF_CONFIG naming it task i of a loopback
  "worker" job (MultiWorkerMirroredStrategy's cluster: every worker runs the program,
  worker 0 is its chief) and DEVICES_ENV; failures and Ctrl-C as processes.launch.
  With `network` (a runtime.namespaces.PrivateNetwork) every copy starts inside it."""
  spec = loopback_cluster(num_workers, with_chief=False, ports=ports)
  return processes.launch(
      command, num_workers, grace_s, timeout_s, network=network,
      env_of=lambda i: {cluster.ENV: tf_config(spec, cluster.WORKER, i),
                        DEVICES_ENV: str(devices_per_worker)})


def launch(command: list, num_workers: int, devices_per_worker: int, grace_s: float,
           timeout_s: float = None, start_timeout_s: float = 60.0, ports=None,
           network=None, chief_env=None) -> int:
  """Starts the workers, then `command` as the chief (TF_CONFIG); its exit code.

  The workers must serve within start_timeout_s. A worker that dies while the command
  runs is named at once; the command then has WORKER_LOSS_GRACE_S to notice and record
  the failure before it is stopped. Ctrl-C / SIGTERM stop everything: 128 + signal.
  With `network` (a runtime.islands.IslandNetwork) every task starts inside its island
  (island_cluster), the chief in island 0; with a runtime.namespaces.PrivateNetwork every
  task starts inside it, on loopback. chief_env adds variables to the chief's
  environment.
  """
  in_islands = bool(network and network.islands)
  spec = (island_cluster(num_workers, network) if in_islands else
          loopback_cluster(num_workers, with_chief=True, ports=ports))
  chief_prefix, chief_env = exec_prefix(network, 0, 1), dict(chief_env or {})
  if in_islands:
    chief_env.update(network.process_env(network.islands[0]))
  lifetime_s = timeout_s + start_timeout_s + 60 if timeout_s else UNBOUNDED_LIFETIME_S
  with tempfile.TemporaryDirectory(prefix="tf_tput_workers_") as log_dir:
    workers = WorkerProcesses(spec, devices_per_worker, log_dir, lifetime_s,
                              die_with_parent=True, network=network)

    def start(interrupted):
      workers.start()
      workers.wait_until_serving(time.monotonic() + start_timeout_s,
                                 f"--start_timeout_s={start_timeout_s:g}", interrupted)

    env = dict(os.environ, **{cluster.ENV: tf_config(spec, cluster.CHIEF, 0)}, **chief_env)
    return processes.run_with_servers(workers, "workers", num_workers, start,
                                      chief_prefix + list(command), env, grace_s,
                                      timeout_s, WORKER_LOSS_GRACE_S)
