"""PyTorch's runtime (tf_tput.runtime.Runtime): devices, the peak probe's matmul
and the barrier, for systems built on torch (--system=torch).

One device per process: the CPU, or where torch sees CUDA GPUs the process's own
(cuda:<local process index modulo the GPUs>). `--num_cpu_devices` may only be 1 (the
CPU, even on a GPU host). A process one of several a launcher started
(runtime/launchers.py) joins the others with torch.distributed (strategy
"multi_process"): under torchrun through its own store (env://); under
tf_tput.launch, srun or mpirun at a TCPStore rendezvous at the launch's coordinator,
which process 0 serves on a socket bound to the coordinator's address only; then gloo
on CPUs, its sockets pinned to the loopback interface when that address is loopback,
or NCCL on GPUs. Processes sharing a CPU split its cores between
them (torch.set_num_threads); the peak probe uses them all, since the others wait.
The process group is destroyed at exit, so no process hangs in its teardown.

Compilation cache (torch.compile's, TorchOptions.compile): inductor's FX graph and
AOTAutograd caches, under the directory train names (on by default) in a
subdirectory per torch version and host CPU, instead of inductor's default under
/tmp. A hit skips inductor's code generation and C++ builds; Dynamo still traces.
"""

import atexit
import datetime
import os
import socket
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.records import provenance
from tf_tput.runtime import cpus, topology as topology_lib
from tf_tput.runtime.topology import Topology
from tf_tput import runtime as runtime_lib


def loopback_interface() -> Optional[str]:
  """The name of the interface holding 127.0.0.1 (psutil where installed, else the
  usual "lo" if this host has it), for GLOO_SOCKET_IFNAME."""
  try:
    import psutil
  except ImportError:
    return "lo" if "lo" in dict((name, i) for i, name in socket.if_nameindex()) else None
  for name, addresses in psutil.net_if_addrs().items():
    if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
      return name
  return None


# A collective's limit, once the group has formed: torch's default for gloo. A step
# may take minutes (the first under torch.compile); joining has its own limit.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def join_group(host: str, port: int, rank: int, world_size: int, backend: str,
               join_timeout_s: float, listen_fd: Optional[int] = None,
               launcher_store: bool = False) -> None:
  """torch.distributed's process group over a TCPStore at host:port that rank 0
  serves on `listen_fd`, a socket already bound to host alone (torch's own listener
  would take every interface). Where host is loopback, gloo's and NCCL's sockets are
  pinned to the loopback interface too. The store waits join_timeout_s for every
  rank; torch's error then says "timed out". Elsewhere a pin to the loopback
  interface (one the environment inherited) is dropped: peers on other hosts could
  not reach it. The environment is as it was afterwards: the backend reads the
  variable when the group forms, and this process's children must not inherit it.
  launcher_store: the launcher serves the store at host:port (torchrun's agent), and
  it is reached through torch's env:// rendezvous, from the launcher's variables."""
  variable = "GLOO_SOCKET_IFNAME" if backend == "gloo" else "NCCL_SOCKET_IFNAME"
  saved, interface = os.environ.get(variable), loopback_interface()
  if host.startswith("127."):
    if interface and saved is None:
      os.environ[variable] = interface
  elif saved is not None and saved == interface:
    del os.environ[variable]
  import torch.distributed as dist
  try:
    if launcher_store:  # what init_process_group("env://") does, its wait bounded
      store, _, _ = next(dist.rendezvous(
          "env://", rank, world_size, timeout=datetime.timedelta(seconds=join_timeout_s)))
      store = dist.PrefixStore("default_pg", store)  # the agent's own keys stay apart
    else:
      store = dist.TCPStore(host, port, world_size, is_master=rank == 0,
                            timeout=datetime.timedelta(seconds=join_timeout_s),
                            wait_for_workers=True, master_listen_fd=listen_fd)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)
  finally:
    if saved is None:
      os.environ.pop(variable, None)
    else:
      os.environ[variable] = saved


def join_processes(dist, launch, backend: str, timeout_s: float) -> None:
  """The launched processes' group (runtime/launchers.py): through the launcher's own
  store where it serves one (torchrun's, env://), else at the launch's coordinator,
  which process 0 serves; failing after timeout_s with a TimeoutError that names the
  coordinator and the flag when a process never joins."""
  num_processes, process_id = launch.num_processes, launch.process_id
  coordinator = launch.store or launch.coordinator
  host, port = coordinator.rsplit(":", 1)
  listen_fd = None
  if process_id == 0 and not launch.store:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
      listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      listener.bind((host, int(port)))
      listener.listen(num_processes)
      listen_fd = listener.detach()  # the store owns it from here on
  try:
    join_group(host, int(port), process_id, num_processes, backend, timeout_s, listen_fd,
               launcher_store=bool(launch.store))
  except (RuntimeError, dist.DistError) as e:
    if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
      raise
    raise TimeoutError(f"process {process_id}: the torch.distributed store at "
                       f"{coordinator} did not gather all {num_processes} processes "
                       f"within --cluster_timeout_s={timeout_s:g}; start them all "
                       "(python -m tf_tput.launch --num_processes=N does) or raise the "
                       "timeout") from None
  atexit.register(leave_processes, dist)


def leave_processes(dist) -> None:
  """Destroys the process group (if any is left), so the process exits cleanly."""
  if dist.is_available() and dist.is_initialized():
    dist.destroy_process_group()


# torch._dynamo's counters of inductor's FX graph cache: a graph it compiled is a
# miss, one it loaded a hit; a bypass is a graph it cannot cache (compiled each run).
CACHE_COUNTERS = ("inductor", "fxgraph_cache_hit", ("fxgraph_cache_miss",
                                                    "fxgraph_cache_bypass"))


class TorchRuntime(runtime_lib.Runtime):
  keeps_compilation_cache = True
  name = "torch"
  finds_local_tpus = False
  serves_workers = False   # processes come from tf_tput.launch --num_processes

  def __init__(self):
    self._counted_from = None  # the counters when compilation_cache() was called

  def compilation_cache(self, directory: Optional[str]) -> None:
    """Keeps torch.compile's compiled graphs under `directory` (None: inductor's and
    AOTAutograd's caches off) and counts hits and misses from here on
    (compilation_cache_hit). Before anything compiles."""
    import torch._functorch.config as autograd_config
    import torch._inductor.config as inductor_config
    on = directory is not None
    inductor_config.fx_graph_cache = on
    autograd_config.enable_autograd_cache = on
    if on:
      import torch
      path = os.path.join(directory, provenance.host_cache_subdirectory(
          f"torch-{torch.__version__}", provenance.cpu_model(), provenance.cpu_flags()))
      os.makedirs(path, exist_ok=True)
      os.environ["TORCHINDUCTOR_CACHE_DIR"] = path  # inductor reads it when it writes
    self._counted_from = self._cache_counts()

  @staticmethod
  def _cache_counts() -> tuple:
    from torch._dynamo.utils import counters
    group, hit, misses = CACHE_COUNTERS
    return counters[group][hit], sum(counters[group][m] for m in misses)

  def compilation_cache_hit(self) -> Optional[bool]:
    """True when every graph compiled since compilation_cache() came from the cache,
    False when one at least was compiled, None when none was (eager, or never set)."""
    if self._counted_from is None:
      return None
    hits, misses = (now - then for now, then in zip(self._cache_counts(),
                                                    self._counted_from, strict=True))
    if not hits and not misses:
      return None
    return misses == 0

  def check(self, strategy: str, every_worker: bool, cluster_timeout_s: float) -> None:
    launch = topology_lib.launched()
    if launch.num_processes > 1 and not (launch.store or launch.coordinator):
      raise UsageError(f"{launch.launcher} started {launch.num_processes} processes but "
                       "names no address their torch.distributed store could be at; "
                       "start them with tf_tput.launch, torchrun, srun or mpirun")

  def resolve(self, num_cpu_devices: Optional[int] = None, strategy: str = "local",
              every_worker: bool = False, cluster_timeout_s: float = 60.0,
              tpu_address=None) -> Topology:
    if num_cpu_devices and num_cpu_devices > 1:
      raise UsageError(f"--num_cpu_devices={num_cpu_devices}: torch runs one device per "
                       "process; for N devices use python -m tf_tput.launch "
                       "--num_processes=N -- python -m tf_tput.train ... with a "
                       "'batch:N' mesh")
    import torch
    import torch.distributed as dist

    launch = topology_lib.launched()
    num_processes, process_id = launch.num_processes, launch.process_id
    cuda = torch.cuda.is_available() and not num_cpu_devices
    if cuda:
      index = launch.local_process_id % torch.cuda.device_count()
      torch.cuda.set_device(index)
      device, platform = f"cuda:{index}", "gpu"
      kind = torch.cuda.get_device_name(index)
    else:
      device, platform, kind = "cpu", "cpu", provenance.cpu_model()
      if launch.local_num_processes > 1:  # the processes share this host's cores
        torch.set_num_threads(max(1, len(cpus.allowed()) // launch.local_num_processes))
    nodes = [provenance.this_node()]
    if num_processes > 1:
      join_processes(dist, launch, "nccl" if cuda else "gloo", cluster_timeout_s)
      # Every process's node, so that process 0, which writes the record, knows all.
      nodes = [None] * num_processes
      dist.all_gather_object(nodes, provenance.this_node())
    return Topology("torch", platform,
                    tuple(f"{platform}:{i}" for i in range(num_processes)), kind,
                    num_processes=num_processes,
                    strategy="multi_process" if num_processes > 1 else "local",
                    islands=topology_lib.launched_islands(),
                    handles={"device": device, "rank": process_id},
                    nodes=tuple(sorted(set(nodes))))

  def gemm_paths(self, strategy: str, dtype: str) -> dict:
    """On CPUs, the GEMM paths of this installation (gemm.py), each selected by
    gemm.PATH_ENV; where the environment sets it, that path only (as TF's switch;
    UsageError for one it lacks); none where torch sees a GPU (cuBLAS is the one path there)."""
    import torch
    from tf_tput.systems.torch import gemm
    if torch.cuda.is_available():
      return {}
    set_value = os.environ.get(gemm.PATH_ENV)
    if set_value is not None:
      if set_value not in gemm.offered():  # before the run: one line, exit 2
        raise UsageError(gemm.unknown(set_value))
      return {set_value: {gemm.PATH_ENV: set_value}}
    return {name: {gemm.PATH_ENV: name} for name in gemm.offered()}

  @property
  def gemm_paths_named_only(self) -> tuple:
    from tf_tput.systems.torch import gemm
    return gemm.NAMED_ONLY

  def matmul_runner(self, topology, n: int, dtype: str):
    import torch
    from tf_tput.measure import peak
    from tf_tput.systems.torch import gemm
    where = f"torch {dtype} peak probe"
    device = topology.handles.get("device", "cpu")
    a = torch.ones((n, n), dtype=getattr(torch, dtype), device=device)
    matmul = gemm.matmul if device == "cpu" else torch.matmul
    if device == "cpu":
      gemm.select()  # the path the run's matmuls take

    def run():
      threads = torch.get_num_threads()
      if device == "cpu":  # the other processes wait at the barrier: every core is free
        torch.set_num_threads(len(cpus.allowed()))
      try:
        corner = matmul(a, a)[0, 0]  # the whole product is computed
        peak.check_matmul_corner(corner.item(), n, where)  # reading a value waits
      finally:
        torch.set_num_threads(threads)
    return run

  def barrier(self, topology):
    """Every launched process meets at torch.distributed's barrier; one waits for none."""
    if topology.num_processes == 1:
      return lambda name: None
    import torch.distributed as dist
    device = topology.handles.get("device", "cpu")
    return lambda name: dist.barrier(
        device_ids=[int(device.split(":")[1])] if device.startswith("cuda") else None)

  def launch_workers(self, *args, **kwargs) -> int:
    raise UsageError("torch has no worker servers to start; launch its processes with "
                     "tf_tput.launch --num_processes=N")


RUNTIME = TorchRuntime()
