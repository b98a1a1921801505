"""A Ray cluster's lifecycle and the gloo group of its actors, for every user of Ray
here: the dispatch micro-benchmark (tf_tput/micro/ray_actors.py) and --system=ray
(its runtime.py and trainer.py, beside this module).

Cluster starts a private cluster on loopback (or joins one at an address) and stops
it: ray.shutdown(), then whatever process it started that is still running (a child
of this process, recursively, that was not there before) gets STOP_GRACE_S to exit
and then SIGKILL; a private cluster's session directory (logs, sockets) is a
temporary one, removed at the end.

Loopback only: Ray's gRPC servers listen on every interface unless its node address
is loopback, and ray.init turns _node_ip_address="127.0.0.1" into the machine's
routable address unless Ray's "cluster mode" is off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
=0, read when ray is imported), so a private cluster switches it off around
ray.init. gloo is pinned to the loopback interface, its rendezvous store to a
listener on 127.0.0.1 (listen_for_rendezvous, join_group).

Ray, torch and psutil (Ray's vendored copy) are imported only inside the functions.
"""

import contextlib
import dataclasses
import os
import shutil
import socket
import tempfile
import time
from typing import Optional

OBJECT_STORE_BYTES = 80 << 20    # Ray's minimum is 75 MiB; batches and results are small
STOP_GRACE_S = 5.0               # after ray.shutdown, before SIGKILL to what is left

# Read by Ray at import; "0" makes its node address loopback (see the docstring).
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                 "RAY_USAGE_STATS_ENABLED": "0"}


class Cluster:
  """This process's connection to a Ray cluster: a private one on loopback with
  num_cpus logical CPUs (one per actor, so 4 actors fit on 2 cores), or, given an
  address, an existing one joined. start() once, stop() any number of times (also
  as a context manager); track() after starting actors, so that stop() finds their
  processes even once their raylet has gone."""

  def __init__(self, num_cpus: int, address: Optional[str] = None,
               object_store_bytes: int = OBJECT_STORE_BYTES):
    self.num_cpus, self.joined = num_cpus, address
    self.address = address or "127.0.0.1"  # a private cluster's, once started
    self._object_store_bytes = object_store_bytes
    self._temp_dir, self._not_ours, self._processes = None, set(), []
    self._started = self._stopped = False

  @property
  def private(self) -> bool:
    return not self.joined

  def start(self) -> "Cluster":
    import ray
    if ray.is_initialized():
      raise RuntimeError("ray is already initialized in this process; tf_tput starts "
                         "(and stops) a cluster connection of its own")
    self._not_ours = {p.pid for p in descendants()}
    self._started = True
    if self.joined:
      from tf_tput.systems.torch.ray import auth
      auth.check_accepted(self.joined)  # a refused token in one line, not 20 tries
      context = ray.init(address=self.joined, log_to_driver=False,
                         configure_logging=False)
    else:
      self._temp_dir = tempfile.mkdtemp(prefix="tf_tput_ray_")  # short: socket paths
      with loopback_env():
        context = ray.init(address="local", num_cpus=self.num_cpus,
                           include_dashboard=False, _node_ip_address="127.0.0.1",
                           object_store_memory=self._object_store_bytes,
                           _temp_dir=self._temp_dir, log_to_driver=False,
                           configure_logging=False)
    self.address = _address(context) if not self.joined else self.joined
    self.track()
    return self

  def track(self) -> None:
    """Notes the processes this cluster has started so far (its actors' too)."""
    self._processes += descendants()

  def stop(self) -> None:
    if not self._started or self._stopped:
      return
    self._stopped = True
    self.track()
    import ray
    try:
      ray.shutdown()
    finally:
      stop_processes([p for p in self._processes if p.pid not in self._not_ours])
      if self._temp_dir:
        shutil.rmtree(self._temp_dir, ignore_errors=True)  # Ray's session: logs, sockets

  def __enter__(self) -> "Cluster":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


@dataclasses.dataclass
class Deadline:
  at: float                 # time.monotonic() by which the wait must be over
  timeout_s: float          # the flag's value
  where: str = "the run's Ray cluster"  # its address, once it has one
  flag: str = "--timeout_s"  # the flag that sets timeout_s, for messages

  @classmethod
  def after(cls, timeout_s: float, **fields) -> "Deadline":
    return cls(time.monotonic() + timeout_s, timeout_s, **fields)

  def left(self) -> float:
    return self.at - time.monotonic()


def get(ray, refs, deadline: Deadline, what):
  """ray.get within the deadline; TimeoutError naming what, where, and the flag."""
  left = deadline.left()
  late = (f"ray: {what} on {deadline.where} did not finish within {deadline.flag}="
          f"{deadline.timeout_s:g} (the actors' start-up counts); raise it")
  if left <= 0:
    raise TimeoutError(late)
  try:
    return ray.get(refs, timeout=left)
  except ray.exceptions.GetTimeoutError as e:
    raise TimeoutError(late) from e


def listen_for_rendezvous(host: str = "127.0.0.1") -> socket.socket:
  """Rank 0's rendezvous listener, bound now (no port race): on 127.0.0.1 unless a
  joined cluster's actors on other nodes must reach it (host: this node's address)."""
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind((host, 0))
  listener.listen(128)
  return listener


def join_group(rank: int, world_size: int, port: int, timeout_s: float,
               listener: Optional[socket.socket] = None, backend: str = "gloo",
               host: str = "127.0.0.1") -> None:
  """The actors' torch.distributed group, rendezvous at host:port (rank 0's listener;
  torch_runtime.join_group: sockets on loopback where host is)."""
  from tf_tput.systems.torch import runtime as torch_runtime
  torch_runtime.join_group(host, port, rank, world_size, backend, timeout_s,
                           listener.fileno() if listener else None)


@contextlib.contextmanager
def loopback_env():
  """Ray's loopback mode for ray.init: its processes (started now) read the env."""
  from ray._private import ray_constants
  saved_env = {k: os.environ.get(k) for k in _LOOPBACK_ENV}
  saved_flag = ray_constants.ENABLE_RAY_CLUSTER
  os.environ.update(_LOOPBACK_ENV)
  ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray was imported
  try:
    yield
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = saved_flag
    for k, v in saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def _address(context) -> str:
  """The local cluster's address as ray.init's context tells it."""
  info = getattr(context, "address_info", None) or {}
  return info.get("gcs_address") or info.get("address") or "127.0.0.1"


def descendants() -> list:
  import psutil  # Ray's vendored copy once ray is imported
  try:
    return psutil.Process().children(recursive=True)
  except psutil.Error:
    return []


def stop_processes(processes) -> None:
  """Waits for processes to exit after ray.shutdown; SIGKILL to the rest."""
  import psutil
  alive = [p for p in {p.pid: p for p in processes}.values() if _running(p)]
  _, alive = psutil.wait_procs(alive, timeout=STOP_GRACE_S)
  alive = [p for p in alive if _running(p)]
  for p in alive:
    with contextlib.suppress(psutil.Error):
      p.kill()
  psutil.wait_procs(alive, timeout=STOP_GRACE_S)


def _running(p) -> bool:
  import psutil
  try:
    return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False
