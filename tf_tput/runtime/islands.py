"""Islands on one machine: network namespaces joined by rate-limited links.

Pathways §5.3 trains across islands of TPUs whose gradients cross a data-centre
network slower than the links inside an island. Here an island is a network
namespace (runtime/namespaces.py) with its own address; its processes start inside it
and reach each other over its loopback. Two islands are joined by one veth pair, more
by a veth pair each to a bridge in a namespace of its own. Each island's end of its
link is shaped with `tc ... tbf` at the DCN rate (netem does not exist on these
kernels), so what one island sends to the others is limited to that rate; the link's
byte counters say how much crossed.

Addresses come only from 198.18.0.0/15, reserved for network benchmarks (RFC 2544),
and live only inside the namespaces made here: the host's own interfaces and routes
are never touched. Inside an island this host's name resolves to the island's
address (`ip netns exec` reads /etc/netns/<namespace>/hosts as /etc/hosts), so
libraries that bind to the host name, as gloo does, bind to the island's link.
Everything made is removed however the run ends, as every Namespaces' is.

How a run's mesh splits across islands is checked before anything starts
(tf_tput/island_split.py); the bytes a reduction sends between them are counted in
tf_tput/reduction.py.
"""

import dataclasses
import ipaddress
import json
import os
import re
import shutil
import socket
from typing import Optional

from tf_tput.errors import UsageError
from tf_tput.runtime import namespaces as netns

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
# Set by tf_tput.launch --islands for every process: the islands' link ends as
# namespace:device pairs, and the rate they are shaped to.
LINKS_ENV = "TF_TPUT_ISLAND_LINKS"
DCN_RATE_ENV = "TF_TPUT_DCN_RATE"


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


@dataclasses.dataclass(frozen=True)
class Island:
  index: int
  namespace: str
  address: str      # this island's address on the inter-island link
  link: str         # its end of the link (a veth inside the namespace)

  def exec_prefix(self) -> list:
    """Prepended to a command to run it inside the island."""
    return ["ip", "netns", "exec", self.namespace]


class IslandNetwork(netns.Namespaces):
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
    run = netns.run
    for name in self.namespaces:
      netns.add_namespace(name)
    if self._bridge:
      run(["ip", "-n", self._bridge, "link", "add", "br0", "type", "bridge"])
      run(["ip", "-n", self._bridge, "link", "set", "br0", "up"])
    first, second = self.islands[0], self.islands[1]
    if not self._bridge:  # two islands: one veth pair, an end in each
      run(["ip", "link", "add", first.link, "netns", first.namespace, "type", "veth",
           "peer", "name", second.link, "netns", second.namespace])
    else:
      for island in self.islands:  # each island's veth to a port of the bridge
        port = f"{self._tag}p{island.index}"
        run(["ip", "link", "add", island.link, "netns", island.namespace, "type", "veth",
             "peer", "name", port, "netns", self._bridge])
        run(["ip", "-n", self._bridge, "link", "set", port, "master", "br0", "up"])
    for island in self.islands:
      ns = island.namespace
      etc = netns.NETNS_ETC / ns
      etc.mkdir(parents=True, exist_ok=True)
      (etc / "hosts").write_text(f"127.0.0.1 localhost\n{island.address} "
                                 f"{socket.gethostname()}\n")
      run(["ip", "-n", ns, "addr", "add", f"{island.address}/{SUBNET.prefixlen}", "dev",
           island.link])
      run(["ip", "-n", ns, "link", "set", island.link, "up"])
      if self.rate_bits_per_s:
        # tbf needs a bucket of at least one timer tick's worth of bytes at the rate.
        burst = max(MIN_BURST_BYTES, self.rate_bits_per_s // 8 // 100)
        run(["tc", "-n", ns, "qdisc", "add", "dev", island.link, "root", "tbf", "rate",
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
      stats = _link_stats(island.namespace, island.link)
      out.append((int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])))
    return out


def _link_stats(namespace: str, device: str) -> dict:
  info = json.loads(netns.run(["ip", "-n", namespace, "-j", "-s", "link", "show", "dev",
                               device]))[0]
  return info.get("stats64", info.get("stats"))


def _link_ends(spec: str) -> list:
  return [tuple(end.split(":", 1)) for end in spec.split(",") if end]


def sent_over_links(spec: str) -> int:
  """Bytes sent so far by every island's end of its link (LINKS_ENV's value): all
  that crossed between islands, each byte counted once, by its sender."""
  return sum(int(_link_stats(namespace, device)["tx"]["bytes"])
             for namespace, device in _link_ends(spec))
