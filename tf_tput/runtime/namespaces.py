"""Linux network namespaces made for a run and removed however it ends.

A subclass of Namespaces names its namespaces and makes their contents: an
IslandNetwork (runtime/islands.py) joins several by rate-limited links, and a
PrivateNetwork here is one namespace with nothing but loopback and no islands:
servers that listen on every interface (some cannot be told otherwise) run inside it
with everything that talks to them, out of reach of other machines.

Everything made is removed on success, failure, Ctrl-C and SIGTERM (the context
manager) and when the process that made it is killed outright: a reaper process,
started first, waits on a pipe whose other end only this process holds, and when it
closes (as the kernel closes it on any death) kills every process still inside the
namespaces and removes them. `ip netns exec` reads /etc/netns/<namespace>/ as /etc,
so a namespace's own files there (its hosts file) go with it.
"""

import abc
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Optional

from tf_tput.errors import UsageError

COMMAND_TIMEOUT_S = 20.0
NETNS_ETC = pathlib.Path("/etc/netns")  # iproute2's per-namespace /etc overlay

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


def private_missing() -> Optional[str]:
  """What this machine lacks to make a PrivateNetwork (root, iproute2's ip), or None."""
  if os.geteuid() != 0:
    return f"network namespaces need root (this process runs as uid {os.geteuid()})"
  if shutil.which("ip") is None:
    return ("network namespaces need iproute2's 'ip', which is not on PATH (apt-get "
            "install iproute2)")
  return None


def run(args: list) -> str:
  """An ip or tc command's output; RuntimeError with its stderr when it fails."""
  proc = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()[-300:]}")
  return proc.stdout


def list_namespaces() -> list:
  """The names `ip netns list` shows."""
  proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                        timeout=COMMAND_TIMEOUT_S)
  return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def add_namespace(name: str) -> None:
  """A new namespace with its loopback up and IPv6 off."""
  run(["ip", "netns", "add", name])
  run(["ip", "-n", name, "link", "set", "lo", "up"])
  # IPv6's own chatter (router solicitations, address probes) would cross an island's
  # link at random moments and blur its byte counters.
  run(["ip", "netns", "exec", name, "sysctl", "-qw",
       "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"])


class Namespaces(abc.ABC):
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


class PrivateNetwork(Namespaces):
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
    add_namespace(self.namespace)

  def exec_prefix(self) -> list:
    """Prepended to a command to run it inside the namespace."""
    return ["ip", "netns", "exec", self.namespace]
