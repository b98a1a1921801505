"""The one way tests find processes a run left behind.

A test marks its environment (MARK = a fresh id); every process it starts, and every
process those start, inherits the mark, orphans included. A process counts as left
behind when it is alive (not a zombie), was created after the test began, and is a
descendant of the test process or carries the test's mark. Other processes on a
shared machine are not the test's.
"""

import time
import uuid

import psutil

MARK = "TF_TPUT_TEST_PROCESS_MARK"


def new_mark() -> str:
  return uuid.uuid4().hex


def left_running(since: float, mark: str, settle_s: float = 1.0) -> list:
  """'pid name cmdline' of each process the marked run left alive, still alive after
  settle_s (a SIGKILLed process needs a moment to be reaped); [] at once if none is."""
  deadline = time.monotonic() + settle_s
  while True:
    found = _alive(since, mark)
    if not found or time.monotonic() >= deadline:
      return found
    time.sleep(0.1)


def _alive(since: float, mark: str) -> list:
  me = psutil.Process()
  mine = {p.pid for p in me.children(recursive=True)}
  found = []
  for p in psutil.process_iter():
    try:
      if (p.pid == me.pid or p.create_time() < since
          or p.status() == psutil.STATUS_ZOMBIE):
        continue
      if p.pid in mine or p.environ().get(MARK) == mark:
        found.append(f"{p.pid} {p.name()} {' '.join(p.cmdline())[:120]}")
    except psutil.Error:
      continue
  return found


def namespaces_left(maker_pid=None, settle_s: float = 10.0) -> list:
  """tf_tput's network namespaces (named tt<maker pid>...) that a run left behind:
  those of `maker_pid`, or, without one, those whose maker has exited. Namespaces of
  makers still running (another xdist worker's launch) are not this test's. A maker
  killed outright leaves its namespaces to its reaper, which removes them a moment
  later: they count only if still there after settle_s."""
  import re
  from tf_tput.runtime import namespaces

  def left():
    out = []
    for name in namespaces.list_namespaces():
      made_by = re.match(r"tt(\d+)", name)
      if made_by and (int(made_by.group(1)) == maker_pid if maker_pid is not None
                      else not psutil.pid_exists(int(made_by.group(1)))):
        out.append(name)
    return out

  deadline = time.monotonic() + settle_s
  while True:
    found = left()
    if not found or time.monotonic() >= deadline:
      return found
    time.sleep(0.2)
