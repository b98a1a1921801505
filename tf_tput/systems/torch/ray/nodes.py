"""A multi-node Ray cluster on this machine, started with Ray's own CLI as a user
starts one (`ray start --head`, then `ray start --address=HEAD`), for tf_tput.launch
--num_workers (each worker a Ray node, the command its driver) and the tests.

Where a runtime.islands.IslandNetwork is given, node i runs in island
network.island_of(i, count) at that island's address, so that what the nodes send
each other (the object store's transfers, gloo between actors, Ray's control RPCs)
crosses the islands' shaped links and nothing else; the driver runs in island 0 with
the head. Without one every node is started at 127.0.0.1: inside a
runtime.namespaces.PrivateNetwork, where loopback is all there is, or, given None (where
servers may be exposed), in this machine's network, where Ray advertises its
routable address instead. Either way Ray's servers listen on every interface: it
refuses a multi-node cluster in the loopback-only mode cluster.py uses.

Each node is one `ray start --block` process in a session of its own, its output in a
log file; the cluster is stopped by SIGTERM to those processes (Ray then stops what it
started), workers first and the head last, and after STOP_GRACE_S by SIGKILL to
whatever they started that is left. The cluster uses token authentication with a
token of its own, in a file of its temporary directory (env()), never the user's
~/.ray/auth_token; driver_env() carries it to the driver.
"""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

from tf_tput.runtime import processes
from tf_tput.systems.torch.ray import cluster as ray_cluster

HEAD_PORT = 6379            # the GCS's port inside an island (a fresh namespace)
READY_MARKER = "Ray runtime started"  # what `ray start` prints once its node is up
STOP_GRACE_S = 10.0         # for a node's `ray start` to stop what it started
LOG_TAIL_LINES = 6


def ray_cli() -> str:
  """Ray's CLI beside this interpreter (a virtual environment's bin), else on PATH."""
  beside = os.path.join(os.path.dirname(sys.executable), "ray")
  return beside if os.path.exists(beside) else (shutil.which("ray") or "ray")


class Nodes:
  """`count` Ray nodes with `cpus_per_node` logical CPUs each; start(), stop()."""

  def __init__(self, count: int, cpus_per_node: int = 1, network=None):
    self.count, self.cpus_per_node, self.network = count, cpus_per_node, network
    self.in_islands = bool(network is not None and network.islands)
    self.head_address = None          # host:port of the head's GCS, once chosen
    self.procs = []                   # each node's `ray start` process
    self._dir = None                  # logs, the auth token, Ray's session dirs
    self._started = []                # psutil processes the nodes started

  def _address(self, index: int) -> str:
    if self.in_islands:
      return self.network.island_of(index, self.count).address
    return "127.0.0.1"

  def exec_prefix(self, index: int) -> list:
    """What starts a process where node `index` runs (0: the head, the driver's)."""
    if self.network is None:
      return []
    if self.in_islands:
      return self.network.island_of(index, self.count).exec_prefix()
    return self.network.exec_prefix()

  def env(self) -> dict:
    """What every process of the cluster, the driver too, needs in its environment:
    the cluster's own token (and no usage reports sent anywhere)."""
    token = os.path.join(self._dir, "auth_token")
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token,
            "RAY_USAGE_STATS_ENABLED": "0"}

  def driver_env(self) -> dict:
    """env() and RAY_ADDRESS, for a driver started with exec_prefix(0)."""
    return {**self.env(), "RAY_ADDRESS": self.head_address}

  def log_path(self, index: int) -> str:
    return os.path.join(self._dir, f"node{index}.log")

  def start(self, timeout_s: float, interrupted=lambda: False,
            head_port: Optional[int] = None) -> "Nodes":
    """Starts the head (its GCS on head_port, else a free one), waits for it, then
    the other nodes; returns once every node says it is up. RuntimeError naming a
    node that exits, TimeoutError after timeout_s, KeyboardInterrupt when
    interrupted() says so."""
    self._dir = tempfile.mkdtemp(prefix="tf_tput_raynodes_")  # short: socket paths
    with open(os.path.join(self._dir, "auth_token"), "w") as f:
      f.write(secrets.token_hex(32))
    port = head_port or (HEAD_PORT if self.in_islands else processes.free_loopback_port())
    self.head_address = f"{self._address(0)}:{port}"
    deadline = time.monotonic() + timeout_s
    self._start_node(0, ["--head", f"--port={port}", "--include-dashboard=false",
                         f"--ray-client-server-port={processes.free_loopback_port()}"])
    self._wait([0], deadline, timeout_s, interrupted)
    for index in range(1, self.count):
      self._start_node(index, [f"--address={self.head_address}"])
    self._wait(range(1, self.count), deadline, timeout_s, interrupted)
    return self

  def _start_node(self, index: int, role: list) -> None:
    command = self.exec_prefix(index) + [
        ray_cli(), "start", "--block", *role, f"--node-ip-address={self._address(index)}",
        f"--num-cpus={self.cpus_per_node}", "--num-gpus=0", "--disable-usage-stats",
        f"--temp-dir={os.path.join(self._dir, f'n{index}')}"]
    with open(self.log_path(index), "wb") as log:
      self.procs.append(processes.popen(command, env=dict(os.environ, **self.env()),
                                        stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT))

  def _wait(self, indices, deadline: float, timeout_s: float, interrupted) -> None:
    processes.wait_for_marker(
        self, {i: self.log_path(i) for i in indices}, READY_MARKER, deadline,
        lambda waiting: f"Ray node(s) {', '.join(map(str, waiting))} were not up "
        f"within --start_timeout_s={timeout_s:g}", interrupted)
    self._track()

  def exited(self) -> list:
    """(index, exit code) of each node whose `ray start` is no longer running."""
    return [(i, p.poll()) for i, p in enumerate(self.procs) if p.poll() is not None]

  def describe(self, index_and_code) -> str:
    index, code = index_and_code
    tail = processes.log_tail(self.log_path(index), LOG_TAIL_LINES, "(empty)")
    return (f"Ray node {index} (pid {self.procs[index].pid}, {self._address(index)}) "
            f"{processes.how(code)}; its log ends: {tail}")

  def _track(self) -> None:
    """Notes every process the nodes have started so far, to stop them all."""
    import psutil
    for p in self.procs:
      try:
        self._started += psutil.Process(p.pid).children(recursive=True)
      except psutil.Error:
        pass

  def raylet_pid(self, index: int) -> Optional[int]:
    """The pid of node `index`'s raylet (for tests that kill a node)."""
    import psutil
    try:
      children = psutil.Process(self.procs[index].pid).children(recursive=True)
    except psutil.Error:
      return None
    return next((c.pid for c in children if c.name() == "raylet"), None)

  def stop(self, grace_s: float = STOP_GRACE_S) -> None:
    """Stops every node, workers first (each `ray start` gets grace_s to stop what it
    started), then removes the temporary directory."""
    if not self.procs and self._dir is None:
      return
    try:
      self._track()
      for p in reversed(self.procs):
        if p.poll() is None:
          try:
            p.send_signal(signal.SIGTERM)  # `ray start` alone: it stops its processes
          except ProcessLookupError:
            pass
        try:
          p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
          pass
    finally:  # a second Ctrl-C included
      processes.stop(self.procs, 0)  # SIGKILL to each node's group that is left
      ray_cluster.stop_processes(self._started)
      self.procs, self._started = [], []
      if self._dir:
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

  def __enter__(self) -> "Nodes":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()


NODE_LOSS_GRACE_S = 60.0  # how long the driver gets to notice a lost node and record it


def launch(command: list, num_nodes: int, cpus_per_node: int, grace_s: float, timeout_s,
           start_timeout_s: float, ports=None, network=None, chief_env=None) -> int:
  """Starts num_nodes Ray nodes (above), then `command` as their driver (RAY_ADDRESS
  names the head; in island 0 with the head), and returns its exit code. A node that
  dies while the command runs is named at once; the command then has
  NODE_LOSS_GRACE_S to record the failure. Ctrl-C / SIGTERM stop everything:
  128 + signal; the driver, then each node, gets grace_s before SIGKILL. ports: --port's, the head's GCS on the first. chief_env adds
  variables to the driver's environment."""
  nodes = Nodes(num_nodes, cpus_per_node, network)
  env = dict(os.environ, **(chief_env or {}))
  if nodes.in_islands:
    env.update(network.process_env(network.islands[0]))

  def start(interrupted) -> dict:
    nodes.start(start_timeout_s, interrupted, head_port=ports[0] if ports else None)
    return nodes.driver_env()  # RAY_ADDRESS: the head's, known once it started

  return processes.run_with_servers(nodes, "Ray nodes", num_nodes, start,
                                    nodes.exec_prefix(0) + list(command), env,
                                    grace_s, timeout_s, NODE_LOSS_GRACE_S)
