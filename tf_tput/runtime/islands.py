"""Islands on one machine: Linux network namespaces joined by rate-limited links.

Pathways §5.3 trains across islands of TPUs whose gradients cross a data-centre
network slower than the links inside an island. Here an island is a network
namespace with its own address; its processes start inside it and reach each other
over its loopback. Two islands are joined by one veth pair, more by a veth pair each
to a bridge in a namespace of its own. Each island's end of its link is shaped with
`tc ... tbf` at the DCN rate (netem does not exist on these kernels), so what one
island sends to the others is limited to that rate; the link's byte counters say how
much crossed.

Addresses come only from 198.18.0.0/15, reserved for network benchmarks (RFC 2544),
and live only inside the namespaces made here: the host's own interfaces and routes
are never touched. Inside an island this host's name resolves to the island's
address (`ip netns exec` reads /etc/netns/<namespace>/hosts as /etc/hosts), so
libraries that bind to the host name, as gloo does, bind to the island's link.
Everything made is removed on success, failure, Ctrl-C and SIGTERM
(the context manager) and when the process that made it is killed outright: a reaper
process, started first, waits on a pipe whose other end only this process holds, and
when it closes (as the kernel closes it on any death) kills every process still
inside the namespaces and removes them.

PrivateNetwork is the same machinery for one namespace with nothing but loopback and
no islands: servers that listen on every interface (some cannot be told otherwise)
run inside it with everything that talks to them, out of reach of other machines.
"""

import abc
import dataclasses
import ipaddress
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
from typing import Optional

from tf_tput.errors import UsageError

ADDRESS_BLOCK = ipaddress.ip_network("198.18.0.0/15")
# Set by tf_tput.launch --islands for each process it starts: its island and how many
# there are (runtime/topology.launched_islands reads the count; the index is for the
# process and its logs).
ISLAND_ENV = "TF_TPUT_ISLAND"
NUM_ISLANDS_ENV = "TF_TPUT_NUM_ISLANDS"
# Namespaces are isolated from the host and from each other's runs: every run can use
# the same subnet without meeting another.
SUBNET = ipaddress.ip_network("198.18.0.0/24")
NO_LIMIT = "none"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
TBF_LATENCY = "100ms"   # how long a packet may queue before tbf drops it
MIN_BURST_BYTES = 64 * 1024
COMMAND_TIMEOUT_S = 20.0
NETNS_ETC = pathlib.Path("/etc/netns")  # iproute2's per-namespace /etc overlay
# Set by tf_tput.launch --islands for every process: the islands' link ends as
# namespace:device pairs, and the rate they are shaped to.
LINKS_ENV = "TF_TPUT_ISLAND_LINKS"
DCN_RATE_ENV = "TF_TPUT_DCN_RATE"

# The reaper: reads its stdin until EOF (the maker closed it or died), then kills
# whatever still runs inside the namespaces (a grandchild of the maker's that no
# parent-death signal reached: Ray's agents outlive their raylet) and removes
# the namespaces named in its arguments. Runs in a session of its own, so signals to
# the maker's terminal or process group do not reach it.
_REAPER = ("import os, shutil, subprocess, sys\n"
           "sys.stdin.buffer.read()\n"
           "for name in sys.argv[1:]:\n"
           "  pids = subprocess.run(['ip', 'netns', 'pids', name], capture_output=True,\n"
           "                        text=True).stdout.split()\n"
           "  for pid in pids:\n"
           "    try:\n"
           "      os.kill(int(pid), 9)\n"
           "    except OSError:\n"
           "      pass\n"
           "  subprocess.run(['ip', 'netns', 'delete', name], stderr=subprocess.DEVNULL)\n"
           f"  shutil.rmtree({str(NETNS_ETC)!r} + '/' + name, ignore_errors=True)\n")


def parse_rate(text: str) -> Optional[int]:
  """'1gbit' -> 10**9 bits/s, '200mbit' -> 2 * 10**8; 'none' -> None (no limit)."""
  if text == NO_LIMIT:
    return None
  match = _RATE.match(text or "")
  if not match or float(match.group(1)) <= 0:
    raise UsageError(f"--dcn_rate={text!r} is not a rate; write e.g. 1gbit, 200mbit, "
                     f"500kbit or {NO_LIMIT}")
  return int(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def format_rate(bits_per_s: Optional[int]) -> str:
  """parse_rate's inverse in tc's units: 10**9 -> '1gbit'; None -> 'none'."""
  if bits_per_s is None:
    return NO_LIMIT
  for unit in ("gbit", "mbit", "kbit"):
    if bits_per_s % _RATE_UNITS[unit] == 0:
      return f"{bits_per_s // _RATE_UNITS[unit]}{unit}"
  return f"{bits_per_s}bit"


def missing() -> Optional[str]:
  """What this machine lacks to make islands (root, iproute2's ip and tc), or None."""
  if os.geteuid() != 0:
    return "islands need root (network namespaces); run as root or without --islands"
  for tool in ("ip", "tc"):
    if shutil.which(tool) is None:
      return (f"islands need iproute2's {tool!r}, which is not on PATH; install "
              "iproute2 (apt-get install iproute2)")
  return None


def private_missing() -> Optional[str]:
  """What this machine lacks to make a PrivateNetwork (root, iproute2's ip), or None."""
  if os.geteuid() != 0:
    return f"network namespaces need root (this process runs as uid {os.geteuid()})"
  if shutil.which("ip") is None:
    return ("network namespaces need iproute2's 'ip', which is not on PATH (apt-get "
            "install iproute2)")
  return None


def _run(args: list) -> str:
  proc = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
  return proc.stdout


@dataclasses.dataclass(frozen=True)
class Island:
  index: int
  namespace: str
  address: str      # this island's address on the inter-island link
  link: str         # its end of the link (a veth inside the namespace)

  def exec_prefix(self) -> list:
    """Prepended to a command to run it inside the island."""
    return ["ip", "netns", "exec", self.namespace]


class _Namespaces(abc.ABC):
  """Network namespaces made on entering and removed on leaving, also when the maker
  is killed outright (the reaper). A subclass (PrivateNetwork, IslandNetwork) names
  them, says what this machine lacks to make them, and makes their contents."""

  def __init__(self, tag: str = ""):
    self._tag = tag or f"tt{os.getpid()}"
    self._reaper = None

  @property
  @abc.abstractmethod
  def namespaces(self) -> list:
    """The names of every namespace this makes."""

  @abc.abstractmethod
  def _missing(self) -> Optional[str]:
    """What this machine lacks to make them (root, iproute2), or None."""

  @abc.abstractmethod
  def _create(self) -> None:
    """Makes the namespaces and their links."""

  def __enter__(self):
    problem = self._missing()
    if problem:
      raise UsageError(problem)
    # Started before anything exists, so nothing can outlive this process.
    self._reaper = subprocess.Popen([sys.executable, "-c", _REAPER, *self.namespaces],
                                    stdin=subprocess.PIPE, start_new_session=True)
    try:
      self._create()
    except BaseException:
      self.remove()
      raise
    return self

  def __exit__(self, *exc):
    self.remove()

  def remove(self) -> None:
    """Kills what still runs inside the namespaces and deletes them (their links go
    with them): the reaper's own work, done now; safe to repeat."""
    if self._reaper is not None:
      self._reaper.stdin.close()  # the reaper kills, deletes, and exits
      self._reaper.wait(timeout=COMMAND_TIMEOUT_S)
      self._reaper = None
    existing = set(list_namespaces())  # left only where the reaper could not run
    for name in self.namespaces:
      if name in existing:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True,
                       timeout=COMMAND_TIMEOUT_S)
      shutil.rmtree(NETNS_ETC / name, ignore_errors=True)


def _add_namespace(name: str) -> None:
  """A new namespace with its loopback up and IPv6 off."""
  _run(["ip", "netns", "add", name])
  _run(["ip", "-n", name, "link", "set", "lo", "up"])
  # IPv6's own chatter (router solicitations, address probes) would cross an island's
  # link at random moments and blur its byte counters.
  _run(["ip", "netns", "exec", name, "sysctl", "-qw",
        "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])


class PrivateNetwork(_Namespaces):
  """One network namespace with nothing but loopback: processes started inside it
  (exec_prefix) reach each other on 127.0.0.1, and nothing outside it reaches what
  they serve, even a server that listens on every interface. It has no islands.

      with PrivateNetwork() as net:
        subprocess.run(net.exec_prefix() + command)
  """

  islands = ()

  def __init__(self, tag: str = ""):
    super().__init__(tag)
    self.namespace = f"{self._tag}lo"

  @property
  def namespaces(self) -> list:
    return [self.namespace]

  def _missing(self) -> Optional[str]:
    return private_missing()

  def _create(self) -> None:
    _add_namespace(self.namespace)

  def exec_prefix(self) -> list:
    """Prepended to a command to run it inside the namespace."""
    return ["ip", "netns", "exec", self.namespace]


class IslandNetwork(_Namespaces):
  """K islands joined by links shaped at rate_bits_per_s (None: unshaped).

      with IslandNetwork(2, 10**9) as net:
        subprocess.run(net.islands[0].exec_prefix() + command)
        net.link_bytes()   # bytes each island sent and received on its link
  """

  def __init__(self, num_islands: int, rate_bits_per_s: Optional[int], tag: str = ""):
    if num_islands < 2:
      raise UsageError(f"--islands={num_islands}; islands are joined by links: pass >= 2, "
                       "or leave --islands unset for one")
    if num_islands > SUBNET.num_addresses - 3:
      raise UsageError(f"--islands={num_islands}; at most {SUBNET.num_addresses - 3}")
    super().__init__(tag)
    self.rate_bits_per_s = rate_bits_per_s
    hosts = list(SUBNET.hosts())
    self.islands = [Island(k, f"{self._tag}i{k}", str(hosts[k]), f"{self._tag}v{k}")
                    for k in range(num_islands)]
    self._bridge = f"{self._tag}br" if num_islands > 2 else None

  @property
  def namespaces(self) -> list:
    return [i.namespace for i in self.islands] + ([self._bridge] if self._bridge else [])

  def _missing(self) -> Optional[str]:
    return missing()

  def _create(self) -> None:
    for name in self.namespaces:
      _add_namespace(name)
    if self._bridge:
      _run(["ip", "-n", self._bridge, "link", "add", "br0", "type", "bridge"])
      _run(["ip", "-n", self._bridge, "link", "set", "br0", "up"])
    first, second = self.islands[0], self.islands[1]
    if not self._bridge:  # two islands: one veth pair, an end in each
      _run(["ip", "link", "add", first.link, "netns", first.namespace, "type", "veth",
            "peer", "name", second.link, "netns", second.namespace])
    else:
      for island in self.islands:  # each island's veth to a port of the bridge
        port = f"{self._tag}p{island.index}"
        _run(["ip", "link", "add", island.link, "netns", island.namespace, "type", "veth",
              "peer", "name", port, "netns", self._bridge])
        _run(["ip", "-n", self._bridge, "link", "set", port, "master", "br0", "up"])
    for island in self.islands:
      ns = island.namespace
      etc = NETNS_ETC / ns
      etc.mkdir(parents=True, exist_ok=True)
      (etc / "hosts").write_text(f"127.0.0.1 localhost\n{island.address} "
                                 f"{socket.gethostname()}\n")
      _run(["ip", "-n", ns, "addr", "add", f"{island.address}/{SUBNET.prefixlen}", "dev",
            island.link])
      _run(["ip", "-n", ns, "link", "set", island.link, "up"])
      if self.rate_bits_per_s:
        # tbf needs a bucket of at least one timer tick's worth of bytes at the rate.
        burst = max(MIN_BURST_BYTES, self.rate_bits_per_s // 8 // 100)
        _run(["tc", "-n", ns, "qdisc", "add", "dev", island.link, "root", "tbf", "rate",
              f"{self.rate_bits_per_s}bit", "burst", str(burst), "latency", TBF_LATENCY])

  def env(self) -> dict:
    """What a run inside the islands needs to know of them (tf_tput.train reads it)."""
    return {LINKS_ENV: ",".join(f"{i.namespace}:{i.link}" for i in self.islands),
            DCN_RATE_ENV: format_rate(self.rate_bits_per_s)}

  def island_of(self, index: int, count: int) -> Island:
    """The island of process (or TF task) `index` of `count`: consecutive ones share
    one, so a device list in process order is island-major."""
    return self.islands[index * len(self.islands) // count]

  def process_env(self, island: Island) -> dict:
    """env() and which island a process started in `island` is in (runtime.topology)."""
    return {ISLAND_ENV: str(island.index), NUM_ISLANDS_ENV: str(len(self.islands)),
            **self.env()}

  def link_bytes(self) -> list:
    """[(bytes sent, bytes received)] of each island's link end, since it was made."""
    out = []
    for island in self.islands:
      info = json.loads(_run(["ip", "-n", island.namespace, "-j", "-s", "link", "show",
                              "dev", island.link]))[0]
      stats = info.get("stats64", info.get("stats"))
      out.append((int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])))
    return out

def list_namespaces() -> list:
  """The names `ip netns list` shows."""
  proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                        timeout=COMMAND_TIMEOUT_S)
  return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def check_mesh(experiment, num_islands: int, parallelism=("data",),
               num_devices: Optional[int] = None) -> None:
  """Across islands the run is data parallel over the island axis: the batch axis
  splits across islands. Inside each island it is data parallel too, or, where the
  system splits the model inside islands ("model" in its parallelism, mtf), any
  other axes follow the batch axis, so that each island holds a block of the mesh.
  A pipeline ("pipeline" in the parallelism) splits its stages across the islands
  instead: S/K consecutive stages each, so K-1 stage boundaries lie on the links.
  num_devices: the devices the launched processes run, where known (--num_cpu_devices
  x processes); a mesh that does not split names a batch-only mesh of that size."""
  if experiment.pipelined:
    stages = experiment.pipeline.stages
    if "pipeline" not in parallelism:
      raise UsageError(f"{num_islands} islands with PipelineConfig.stages = {stages}: "
                       "this system is data parallel across islands; drop the pipeline")
    if stages % num_islands:
      raise UsageError(f"PipelineConfig.stages = {stages} across {num_islands} islands: "
                       "each island holds an equal run of stages; choose stages that "
                       f"are a multiple of {num_islands}")
    return
  axis = experiment.layout.get("batch", "batch")
  other = {a: n for a, n in experiment.mesh_shape.items() if a != axis and n > 1}
  if other and "model" not in parallelism:
    raise UsageError(f"mesh_shape {experiment.mesh.mesh_shape!r} across {num_islands} "
                     f"islands: islands are data parallel inside too, but axes {other} "
                     f"split the model; use a batch-only mesh such as 'batch:"
                     f"{experiment.num_devices}', or a system that splits the model inside "
                     "islands (docs/islands.md)")
  if other and next(iter(experiment.mesh_shape)) != axis:
    raise UsageError(f"mesh_shape {experiment.mesh.mesh_shape!r} across {num_islands} "
                     f"islands: the batch axis {axis!r} must come first, so that each "
                     f"island holds a block of the mesh; write e.g. '{axis}:"
                     f"{experiment.mesh_shape.get(axis, 1)};"
                     + ";".join(f"{a}:{n}" for a, n in experiment.mesh_shape.items()
                                if a != axis) + "'")
  if experiment.mesh_shape.get(axis, 1) % num_islands:
    from tf_tput import GIN_DIR

    def batch_mesh(size: int) -> str:
      """The flag that passes a batch-only mesh of `size` devices: a file of GIN_DIR's
      mesh folder that binds exactly that, else the binding itself."""
      for path in sorted((GIN_DIR / "mesh").glob("*.gin")):
        bound = re.search(r"^MeshConfig\.mesh_shape\s*=\s*['\"]([^'\"]*)['\"]",
                          path.read_text(), re.MULTILINE)
        if bound and bound.group(1).replace(" ", "") == f"batch:{size}":
          return f"--gin_file={path.stem}"
      return f"--gin_param=\"MeshConfig.mesh_shape = '{axis}:{size}'\""

    used = experiment.num_devices
    problem = (f"batch axis {axis!r} does not split into {num_islands} islands; the "
               f"mesh is {experiment.mesh.mesh_shape!r} ({used} device"
               f"{'s' * (used != 1)})")
    if num_devices is None:
      raise UsageError(f"{problem}: pass a mesh over all the run's devices whose batch "
                       f"axis is a multiple of {num_islands}, such as "
                       f"{batch_mesh(num_islands)} ({num_islands} devices)")
    runs = f"{'but' if num_devices != used else 'and'} {num_devices} devices run"
    if num_devices % num_islands:
      raise UsageError(f"{problem} {runs}, which do not split into {num_islands} "
                       f"islands: run a multiple of {num_islands} devices with a "
                       f"batch-only mesh of as many, such as {batch_mesh(num_islands)} "
                       f"({num_islands} devices)")
    raise UsageError(f"{problem} {runs}: pass a mesh with {num_devices} devices such as "
                     f"{batch_mesh(num_devices)}")


def ring_link_bytes(nbytes: int, members: int, num_islands: int) -> int:
  """Bytes a ring all-reduce of `nbytes` over `members` sends between islands, the
  members island-major in equal shares: K of the ring's edges cross (each island's
  last member to the next island's first, the last island's back to the first).
  One island: nothing crosses."""
  if num_islands < 2:
    return 0
  return ring_bytes_between(nbytes, [m * num_islands // members for m in range(members)])


def ring_bytes_between(nbytes: int, member_islands: list) -> int:
  """Bytes a ring all-reduce of `nbytes` sends between islands, member i (in ring
  order) in island member_islands[i]: every edge between two islands carries
  2(P-1)/P of the bytes (reduce-scatter, then all-gather). Transport headers are not
  counted."""
  members = len(member_islands)
  crossing = sum(member_islands[i] != member_islands[(i + 1) % members]
                 for i in range(members))
  return 2 * crossing * (members - 1) * nbytes // members if members > 1 else 0


def analytic_link_bytes(gradient_bytes: int, num_islands: int) -> int:
  """Bytes the hierarchical reduction sends over all inter-island links per step:
  every island's shards of the gradient, all-reduced across the K islands as a ring
  (one member per island), sum one gradient's bytes per island: 2(K-1) gradients."""
  return ring_link_bytes(gradient_bytes, num_islands, num_islands)


def island_of_stage(stage: int, stages: int, num_islands: int) -> int:
  """A pipeline's stages split across the islands in order, S/K each (check_mesh)."""
  return stage * num_islands // stages


def _link_ends(spec: str) -> list:
  return [tuple(end.split(":", 1)) for end in spec.split(",") if end]


def sent_over_links(spec: str) -> int:
  """Bytes sent so far by every island's end of its link (LINKS_ENV's value): all
  that crossed between islands, each byte counted once, by its sender."""
  total = 0
  for namespace, device in _link_ends(spec):
    info = json.loads(_run(["ip", "-n", namespace, "-j", "-s", "link", "show", "dev",
                            device]))[0]
    total += int(info.get("stats64", info.get("stats"))["tx"]["bytes"])
  return total
