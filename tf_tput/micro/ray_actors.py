"""--systems=ray: Ray actors with PyTorch AllReduce, the paper's Ray baseline.

Each host is one Ray actor (a worker process) in a private Ray cluster on loopback.
run() starts the cluster and keeps it for the next spec of as many hosts (the next
mode: a cluster's start-up is ~3 s, its actors' ~0.3 s); each spec has actors of its
own, killed once it is measured. A spec with another host count, a failed run,
close() and the process's exit stop the cluster. The actors join one
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

The cluster's lifecycle (private, on loopback; stopped with whatever it started,
on success, failure, timeout and Ctrl-C) and the gloo rendezvous are
tf_tput/systems/torch/ray/cluster.py's, shared with --system=ray.
"""

import atexit
import time

from tf_tput import micro
from tf_tput.systems.torch.ray import cluster as ray_cluster

MODES = micro.MODES
run_private = None  # the cluster listens on loopback (cluster.py): no namespace needed


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
    self._listener = ray_cluster.listen_for_rendezvous()
    return self._listener.getsockname()[1]

  def join(self, port: int, timeout_s: float) -> None:
    """The process group: rendezvous at tcp://127.0.0.1:port, gloo on loopback."""
    ray_cluster.join_group(self._rank, self._hosts, port, timeout_s, self._listener)

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
  deadline = ray_cluster.Deadline.after(spec.timeout_s)
  import ray

  try:
    cluster = _cluster_for(spec.hosts)
    deadline.where = f"the run's Ray cluster at {cluster.address}"
    hosts = _start_hosts(ray, spec, deadline)
    cluster.track()
    bench = _Bench(ray, spec, hosts, deadline)
    bench.repeat()  # warmup
    times = []
    for _ in range(spec.repeats):
      start = time.perf_counter()
      bench.repeat()
      times.append(time.perf_counter() - start)
    for host in hosts:  # their CPUs, for the next spec's actors
      ray.kill(host)
    return times
  except BaseException:
    close()  # nothing of a failed run stays
    raise


def close() -> None:
  """Stops the kept cluster, with whatever it started (tf_tput.micro calls it once
  its runs are done; at exit it runs)."""
  global _kept
  kept, _kept = _kept, None
  if kept is not None:
    kept.stop()


def _cluster_for(hosts: int):
  """The kept cluster if it has one logical CPU per host (one per actor, so 4 hosts
  fit on 2 cores), else a new one, kept."""
  global _kept
  if _kept is not None and _kept.num_cpus != hosts:
    close()
  if _kept is None:
    cluster = ray_cluster.Cluster(num_cpus=hosts)
    try:
      cluster.start()
    except BaseException:
      cluster.stop()  # what a start that failed part-way started
      raise
    _kept = cluster
  return _kept


_kept = None  # the private ray_cluster.Cluster run() keeps for the next spec
atexit.register(close)


def _start_hosts(ray, spec, deadline):
  actor = ray.remote(num_cpus=1, max_restarts=0)(Host)
  hosts = [actor.remote(rank, spec.hosts, spec.devices_per_host, spec.matmul_n)
           for rank in range(spec.hosts)]
  port = ray_cluster.get(ray, hosts[0].listen.remote(), deadline, "starting the hosts")
  timeout_s = max(1.0, deadline.left())
  ray_cluster.get(ray, [h.join.remote(port, timeout_s) for h in hosts], deadline,
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
      refs = [h.computation.remote(ref) for h, ref in zip(self._hosts, refs, strict=True)]
    self._finish(refs, self._spec.chain_length)

  def _fused(self):
    self._finish([h.loop.remote(self._spec.chain_length) for h in self._hosts],
                 self._spec.chain_length)

  def _finish(self, refs, computations):
    values = ray_cluster.get(self._ray, refs, self._deadline,
                             f"{self._spec.mode} computations")
    self.done += computations
    expected = micro.expected(self._spec, self.done)
    for rank, devices in enumerate(values):
      for d, value in enumerate(devices):
        micro.check(value, expected, f"ray host {rank} device {d} after "
                    f"{self.done} computations")
