"""tf_tput/runtime/islands.py and namespaces.py: namespaces, shaped links, counters, and no
leftovers.

Needs root and iproute2 (skipped otherwise, with the reason). Traffic stays inside
the namespaces the tests make, on 198.18.0.0/15 addresses.
"""

import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tf_tput.errors import UsageError
from tf_tput.runtime import islands, namespaces

from process_checks import namespaces_left

REPO = pathlib.Path(__file__).resolve().parents[2]
# They time shaped links: one xdist worker runs them all, one after another.
pytestmark = pytest.mark.xdist_group("islands")
needs_islands = pytest.mark.skipif(islands.missing() is not None,
                                   reason=str(islands.missing()))

_RECEIVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 5001)); s.listen(4)
print("ready", flush=True)
total = 0
for _ in range(int(sys.argv[2])):
  c, _ = s.accept()
  while True:
    data = c.recv(1 << 16)
    if not data:
      break
    total += len(data)
print(total, flush=True)
"""
_SENDER = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5001), timeout=30)
s.sendall(b"x" * int(sys.argv[2])); s.close()
"""


def _send(net, to: int, senders, nbytes: int) -> tuple:
  """Bytes received by island `to` from each sender island, and the seconds taken."""
  receiver = subprocess.Popen(
      net.islands[to].exec_prefix() + [sys.executable, "-c", _RECEIVER,
                                       net.islands[to].address, str(len(senders))],
      stdout=subprocess.PIPE, text=True)
  try:
    assert receiver.stdout.readline().strip() == "ready"
    start = time.monotonic()
    for k in senders:
      subprocess.run(net.islands[k].exec_prefix() + [
          sys.executable, "-c", _SENDER, net.islands[to].address, str(nbytes)],
          check=True, timeout=60)
    total = int(receiver.stdout.readline())
    return total, time.monotonic() - start
  finally:
    receiver.kill()
    receiver.wait()


@needs_islands
def test_two_islands_send_at_most_the_link_rate_and_count_the_bytes():
  with islands.IslandNetwork(2, 8 * 10**6) as net:  # 8 Mbit/s: 1 MB takes >= 1 s
    assert {i.namespace for i in net.islands} <= set(namespaces.list_namespaces())
    assert all(i.address.startswith("198.18.") for i in net.islands)
    resolved = subprocess.run(net.islands[1].exec_prefix() + [
        sys.executable, "-c", "import socket; print(socket.gethostbyname(socket.gethostname()))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert resolved == net.islands[1].address  # what gloo binds to
    received, seconds = _send(net, 1, [0], 10**6)
    assert received == 10**6
    assert seconds >= 0.9  # cannot beat the shaped rate (TCP headers add to it)
    (sent0, recv0), (sent1, recv1) = net.link_bytes()
    assert sent0 >= 10**6 and recv1 == sent0 and recv0 == sent1
  assert namespaces_left(os.getpid()) == []


@needs_islands
def test_three_islands_meet_through_a_bridge_unshaped():
  with islands.IslandNetwork(3, None) as net:
    received, _ = _send(net, 2, [0, 1], 10**5)
    assert received == 2 * 10**5
    sent = [tx for tx, _ in net.link_bytes()]
    assert sent[0] >= 10**5 and sent[1] >= 10**5
  assert namespaces_left(os.getpid()) == []


@needs_islands
def test_an_error_inside_removes_everything():
  with pytest.raises(RuntimeError, match="boom"):
    with islands.IslandNetwork(2, 10**9):
      raise RuntimeError("boom")
  assert namespaces_left(os.getpid()) == []
  assert not list(namespaces.NETNS_ETC.glob(f"tt{os.getpid()}*"))


@needs_islands
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_maker_that_is_killed_leaves_nothing(sig):
  """Even SIGKILL, which no handler sees: the reaper kills what still runs inside
  (here a process in a session of its own, as Ray's agents are) and removes the
  namespaces."""
  maker = subprocess.Popen(
      [sys.executable, "-c", "import subprocess, time; from tf_tput.runtime import islands\n"
       "with islands.IslandNetwork(3, 10**8) as net:\n"
       "  inside = subprocess.Popen(net.islands[1].exec_prefix() + ['sleep', '600'],\n"
       "                            start_new_session=True)\n"
       "  print('up', inside.pid, flush=True); time.sleep(600)"],
      stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
  try:
    up, inside = maker.stdout.readline().split()
    assert up == "up"
    assert len(namespaces_left(maker.pid, settle_s=0)) == 4  # 3 islands + the bridge
    maker.send_signal(sig)
    maker.wait(timeout=30)
    deadline = time.monotonic() + 20
    while namespaces_left(maker.pid) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert namespaces_left(maker.pid) == []
    assert not any((namespaces.NETNS_ETC / f"tt{maker.pid}i{k}").exists() for k in range(3))
    assert not psutil.pid_exists(int(inside)) or psutil.Process(
        int(inside)).status() == psutil.STATUS_ZOMBIE
  finally:
    maker.kill()


@pytest.mark.parametrize("text, bits", [("1gbit", 10**9), ("200mbit", 2 * 10**8),
                                        ("2.5gbit", 25 * 10**8), ("none", None)])
def test_rates(text, bits):
  assert islands.parse_rate(text) == bits


@pytest.mark.parametrize("text", ["1gb", "fast", "0mbit", ""])
def test_a_bad_rate_is_one_line(text):
  with pytest.raises(UsageError, match="is not a rate; write e.g. 1gbit"):
    islands.parse_rate(text)


def test_without_root_islands_say_so(monkeypatch):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  assert islands.missing().startswith("islands need root")
  with pytest.raises(UsageError, match="islands need root"):
    with islands.IslandNetwork(2, None):
      pass
