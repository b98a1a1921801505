"""--systems=ray: Ray actors with PyTorch AllReduce, the paper's Ray baseline.

Each host is one Ray actor (a worker process) in a private Ray cluster that run()
starts on loopback and stops before it returns. The actors join one
torch.distributed gloo process group (rank = actor index, world = hosts). An actor
holds its devices_per_host int32 scalars as one torch tensor; one computation is the
local sum, dist.all_reduce(SUM) across actors, then every device value becomes
sum // num_devices + 1 (micro/__init__.py). With a matmul size, each device slot
first adds 1 when (A @ A)[0, 0] == n, as it does exactly for an n x n float32
matrix A of ones.

Modes (the driver is the client):
  opbyop   one round per computation: every actor's computation.remote(), then
           ray.get on all of them;
  chained  every actor's k-th call takes its (k-1)-th call's ObjectRef as its input,
           chain_length deep; the driver ray.get()s only the last refs. (Ray
           resolves a small result through its owner's core worker, the driver
           process's, but the driver program does not wait in between.)
  fused    one call per actor that loops chain_length computations.

Every value the driver gets back (each device of each host) is checked; the chained
and fused ones close chain_length dependent computations, so one wrong AllReduce
makes them wrong too.

Loopback only: Ray's gRPC servers listen on every interface unless its node address
is loopback, and ray.init turns _node_ip_address="127.0.0.1" into the machine's
routable address unless Ray's "cluster mode" is off (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
=0, read when ray is imported), so run() switches it off around ray.init. gloo is
pinned to the loopback interface, its rendezvous store to a listener on 127.0.0.1.

Stopping: ray.shutdown() in a finally, then whatever process the run started that is
still running (a child of this process, recursively, that was not there before) gets
STOP_GRACE_S to exit and then SIGKILL. Ray's session directory (logs, sockets) is a
temporary one, removed at the end.
"""

import contextlib
import dataclasses
import datetime
import os
import shutil
import socket
import tempfile
import time

from tf_tput import micro

MODES = micro.MODES
OBJECT_STORE_BYTES = 80 << 20    # Ray's minimum is 75 MiB; the results are tiny
STOP_GRACE_S = 5.0               # after ray.shutdown, before SIGKILL to what is left

# Read by Ray at import; "0" makes its node address loopback (see the docstring).
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                 "RAY_USAGE_STATS_ENABLED": "0"}


def unavailable():
  try:
    import ray  # noqa: F401
    import torch
    import torch.distributed as dist
  except ImportError as e:
    return f"the ray extra is not installed ({e}): pip install -e '.[ray]'"
  if not dist.is_available() or not dist.is_gloo_available():
    return f"torch {torch.__version__} has no gloo torch.distributed backend"
  return None


class Host:
  """One host: devices_per_host emulated devices, one rank of a gloo process group."""

  def __init__(self, rank, hosts, devices_per_host, matmul_n):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # the hosts share the machine's cores
    self._torch, self._dist = torch, dist
    self._rank, self._hosts = rank, hosts
    self._num_devices = hosts * devices_per_host
    self._x = torch.zeros(devices_per_host, dtype=torch.int32)
    self._a = (torch.full((matmul_n, matmul_n), micro.MATMUL_FILL, dtype=torch.float32)
               if matmul_n else None)
    self._listener = None

  def listen(self) -> int:
    """Rank 0: the rendezvous port, already listening on 127.0.0.1 (no port race)."""
    self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    self._listener.bind(("127.0.0.1", 0))
    self._listener.listen(128)
    return self._listener.getsockname()[1]

  def join(self, port: int, timeout_s: float) -> None:
    """The process group: rendezvous at tcp://127.0.0.1:port, gloo on loopback."""
    import psutil  # Ray's vendored copy
    loopback = _loopback_interface(psutil)
    if loopback:
      os.environ["GLOO_SOCKET_IFNAME"] = loopback  # else: the hostname's address
    timeout = datetime.timedelta(seconds=timeout_s)
    # What init_method="tcp://127.0.0.1:port" builds, but the server keeps the
    # listener bound above: torch's own would listen on every interface.
    store = self._dist.TCPStore(
        "127.0.0.1", port, self._hosts, is_master=self._rank == 0, timeout=timeout,
        master_listen_fd=self._listener.fileno() if self._listener else None)
    self._dist.init_process_group("gloo", store=store, rank=self._rank,
                                  world_size=self._hosts, timeout=timeout)

  def computation(self, x=None) -> list:
    """One computation from x (the previous one's output) or the values held here."""
    if x is not None:
      self._x = self._torch.tensor(x, dtype=self._torch.int32)
    self._compute()
    return self._x.tolist()

  def loop(self, n: int) -> list:
    for _ in range(n):
      self._compute()
    return self._x.tolist()

  def _compute(self) -> None:
    x = self._x
    if self._a is not None:
      for d in range(x.numel()):
        # 1 for a full matmul of ones, 0 for a skipped or partial one (micro.__init__).
        x[d] += int((self._a @ self._a)[0, 0] == self._a.shape[0])
    total = x.sum(dtype=self._torch.int32)
    self._dist.all_reduce(total, op=self._dist.ReduceOp.SUM)
    self._x = self._torch.full_like(x, int(total) // self._num_devices + 1)


def run(spec: micro.Spec) -> list:
  if spec.mode not in MODES:
    raise ValueError(f"ray has no mode {spec.mode!r}; it has {', '.join(MODES)}")
  if spec.mode != "opbyop" and spec.computations % spec.chain_length:
    raise ValueError(f"computations={spec.computations} is not a multiple of "
                     f"chain_length={spec.chain_length}")
  deadline = _Deadline(time.monotonic() + spec.timeout_s, spec.timeout_s)
  import ray

  if ray.is_initialized():
    raise RuntimeError("ray is already initialized in this process; the ray micro-"
                       "benchmark starts (and stops) a private cluster of its own")
  temp_dir = tempfile.mkdtemp(prefix="tf_tput_ray_")  # short: Ray's socket paths
  not_ours = {p.pid for p in _descendants()}
  processes = []
  try:
    with _loopback_ray_env():
      # Ray's CPUs are logical: one per host actor, so 4 hosts fit on 2 cores.
      context = ray.init(address="local", num_cpus=spec.hosts, include_dashboard=False,
                         _node_ip_address="127.0.0.1",
                         object_store_memory=OBJECT_STORE_BYTES, _temp_dir=temp_dir,
                         log_to_driver=False, configure_logging=False)
    deadline.where = f"the run's Ray cluster at {_address(context)}"
    processes += _descendants()
    hosts = _start_hosts(ray, spec, deadline)
    processes += _descendants()
    bench = _Bench(ray, spec, hosts, deadline)
    bench.repeat()  # warmup
    times = []
    for _ in range(spec.repeats):
      start = time.perf_counter()
      bench.repeat()
      times.append(time.perf_counter() - start)
    return times
  finally:
    processes += _descendants()
    try:
      ray.shutdown()
    finally:
      _stop([p for p in processes if p.pid not in not_ours])
      shutil.rmtree(temp_dir, ignore_errors=True)  # Ray's session: logs, sockets


def _start_hosts(ray, spec, deadline):
  actor = ray.remote(num_cpus=1, max_restarts=0)(Host)
  hosts = [actor.remote(rank, spec.hosts, spec.devices_per_host, spec.matmul_n)
           for rank in range(spec.hosts)]
  port = _get(ray, hosts[0].listen.remote(), deadline, "starting the hosts")
  timeout_s = max(1.0, deadline.left())
  _get(ray, [h.join.remote(port, timeout_s) for h in hosts], deadline,
       f"joining the process group (its rendezvous at tcp://127.0.0.1:{port})")
  return hosts


class _Bench:
  """The client: issues computations in the spec's mode and checks what comes back."""

  def __init__(self, ray, spec, hosts, deadline):
    self._ray, self._spec, self._hosts, self._deadline = ray, spec, hosts, deadline
    self.done = 0  # computations every device has completed

  def repeat(self) -> None:
    for _ in range(self._spec.calls_per_repeat):
      getattr(self, "_" + self._spec.mode)()

  def _opbyop(self):
    self._finish([h.computation.remote() for h in self._hosts], 1)

  def _chained(self):
    refs = [None] * len(self._hosts)
    for _ in range(self._spec.chain_length):
      refs = [h.computation.remote(ref) for h, ref in zip(self._hosts, refs)]
    self._finish(refs, self._spec.chain_length)

  def _fused(self):
    self._finish([h.loop.remote(self._spec.chain_length) for h in self._hosts],
                 self._spec.chain_length)

  def _finish(self, refs, computations):
    values = _get(self._ray, refs, self._deadline, f"{self._spec.mode} computations")
    self.done += computations
    expected = micro.expected(self._spec, self.done)
    for rank, devices in enumerate(values):
      for d, value in enumerate(devices):
        micro.check(value, expected, f"ray host {rank} device {d} after "
                    f"{self.done} computations")


@dataclasses.dataclass
class _Deadline:
  at: float                 # time.monotonic() by which the run must be over
  timeout_s: float          # spec.timeout_s: tf_tput.micro --timeout_s
  where: str = "the run's Ray cluster"  # its address, once it has one

  def left(self) -> float:
    return self.at - time.monotonic()


def _address(context) -> str:
  """The local cluster's address as ray.init's context tells it."""
  info = getattr(context, "address_info", None) or {}
  return info.get("gcs_address") or info.get("address") or "127.0.0.1"


def _get(ray, refs, deadline: _Deadline, what):
  """ray.get within the run's deadline; TimeoutError naming what, where, and the flag."""
  left = deadline.left()
  late = (f"ray: {what} on {deadline.where} did not finish within --timeout_s="
          f"{deadline.timeout_s:g} (the hosts' start-up counts); raise it")
  if left <= 0:
    raise TimeoutError(late)
  try:
    return ray.get(refs, timeout=left)
  except ray.exceptions.GetTimeoutError as e:
    raise TimeoutError(late) from e


@contextlib.contextmanager
def _loopback_ray_env():
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


def _loopback_interface(psutil):
  for name, addresses in psutil.net_if_addrs().items():
    if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
      return name
  return None


def _descendants() -> list:
  import psutil  # Ray's vendored copy once ray is imported
  try:
    return psutil.Process().children(recursive=True)
  except psutil.Error:
    return []


def _stop(processes) -> None:
  """Waits for the run's processes to exit after ray.shutdown; SIGKILL to the rest."""
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
