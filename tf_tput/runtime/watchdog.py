"""How a train run that cannot finish still ends in one record (docs/records.md, "status").

Signals. SIGTERM (Slurm's scancel and preemption, a pod's eviction, a launcher stopping
its processes), SIGINT (Ctrl-C) and SIGHUP ask the run to end: the measured loop stops
before its next window (loop.run's should_stop), the run records what it measured so
far as `interrupted` and exits 128 + the signal. Where the run's main thread cannot get
there within GRACE_S (inside a framework call, a long build or step, that returns to
Python only when done; with other processes, also in a collective whose peer has gone:
why_stuck says which for the stage), this module's thread writes the record from a
snapshot of the measurement and ends the process at once: inside the 5 s grace of
tf_tput.launch and Slurm's 30 s KillWait.

Hung steps. A window of the measured loop (sync_every steps) that has not completed
within its bound (window_bound) ends the run the same way, as `failed`, naming the step
and the time waited; under tf_tput.launch, which process stopped answering as well
(heartbeats: each process's thread rewrites a small file every HEARTBEAT_S, in the
directory tf_tput.launch names in processes.HEARTBEAT_DIR_ENV).

The thread, not a Python signal handler, is what notices: a handler runs only when the
main thread runs Python, and a collective that waits for a stopped peer never returns
to it. Signals reach the thread through signal.set_wakeup_fd.
"""

import dataclasses
import itertools
import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Callable, Optional

from tf_tput.measure import loop
from tf_tput.errors import UsageError
from tf_tput.runtime import processes, topology

# The signals that ask a run to end, and how long the main thread gets to record it.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
GRACE_S = 3.0
POLL_S = 0.25
# The default bound on a window (--step_timeout_s unset): the first, which compiles,
# gets FIRST_WINDOW_S; every later one FACTOR times the slowest so far (the first left
# out once another has completed), and never less than FLOOR_S.
FIRST_WINDOW_S = 3600.0
FACTOR = 20.0
FLOOR_S = 300.0
HEARTBEAT_S = 1.0
# A heartbeat older than this: its process is stopped, or blocked holding the GIL.
SILENT_S = 5 * HEARTBEAT_S


@dataclasses.dataclass(frozen=True)
class Ending:
  """Why a run ended before its loop returned on its own."""
  status: str                   # the record's: interrupted or failed
  error: str                    # the record's error
  exit_code: int
  signal: Optional[str] = None  # the record's signal: SIGTERM, SIGINT, SIGHUP


def signal_name(signum: int) -> str:
  return signal.Signals(signum).name


def interrupted(signum: int, where: str) -> Ending:
  return Ending("interrupted", f"{signal_name(signum)} {where}",
                128 + signum, signal_name(signum))


def progress(measurement, stage: str) -> str:
  """How far a run got, for an interrupted record's error."""
  steps = measurement.steps_completed
  if not steps:
    return f"in its {stage}, before any step"
  return (f"after {steps} step(s), {len(measurement.tokens)} of them measured")


# Why the main thread has not stopped within GRACE_S, by its stage: Python runs its
# signal handler only between bytecodes, so a call into a framework's C++ (graph
# construction, a compile, a step) delays it until the call returns. Waiting on a
# peer process is a reason only where the run has peers (MULTI_PROCESS_STUCK).
STUCK = {
    "build": "building the trainer, in the framework's graph construction or "
             "compilation, which returns to Python only when done",
    "devices": "starting the framework on its devices, a call that returns to Python "
               "only when done",
    "train": "inside a step, a framework call that returns to Python only when the "
             "step ends",
}
STUCK["trace"] = STUCK["train"]
MULTI_PROCESS_STUCK = {
    "devices": "joining the run's other processes, one of which has not started or "
               "has gone",
    "train": "blocked in a step, e.g. in a collective whose peer has gone",
}
MULTI_PROCESS_STUCK["trace"] = MULTI_PROCESS_STUCK["train"]


def why_stuck(stage: str, num_processes: int) -> str:
  """Why a run in `stage` did not stop within GRACE_S, for an interrupted record."""
  why = (MULTI_PROCESS_STUCK.get(stage) if num_processes > 1 else None) or STUCK.get(
      stage, f"in its {stage}, a call that has not returned to Python")
  return f" (it did not stop within {GRACE_S:g} s: {why})"


def window_bound(durations: list, step_timeout_s: Optional[float]) -> float:
  """Seconds the next window may take, given the windows completed so far
  (`durations`, the first one first). The first compiles: it gets FIRST_WINDOW_S, or
  --step_timeout_s where longer. Later ones get --step_timeout_s where given, else a
  bound derived from what was measured."""
  if not durations:
    return max(FIRST_WINDOW_S, step_timeout_s or 0)
  if step_timeout_s is not None:
    return step_timeout_s
  later = durations[1:] or durations
  return max(FLOOR_S, FACTOR * max(later))


class Watchdog:
  """Catches the ending signals and watches the measured loop, as a context manager
  (install() to close()) around the run, whose main thread ends it with end().
  finish(ending, from_thread) writes the run's record (or nothing, in a process that
  does not write one) and returns its exit code; it runs once, in whichever thread
  claims the ending first (claim()); from_thread: the main thread is still running,
  so read a snapshot of what it measured."""

  def __init__(self, finish: Callable[[Ending, bool], int],
               step_timeout_s: Optional[float], process_id: int = 0,
               progress: Callable[[], tuple] = lambda: (None, "start"),
               num_processes: Optional[int] = None):
    self._finish = finish
    # The run's processes (None: as its launcher started them): with one, no peer
    # can be what a stuck main thread waits for.
    self._num_processes = num_processes or _launched_processes()
    # How far the run got: (a snapshot of its measurement, its stage).
    self._progress = progress
    self._step_timeout_s = step_timeout_s
    self._process_id = process_id
    self.signum: Optional[int] = None
    self._signalled_at = None
    self._measurement = None  # the live one, once the loop runs (watch())
    self._claim = threading.Lock()
    self._closed = threading.Event()
    self._heartbeat = None
    self._reader = self._writer = self._thread = None
    self._previous = {}

  # The main thread's side.
  def install(self) -> "Watchdog":
    self._reader, self._writer = socket.socketpair()
    for end in (self._reader, self._writer):
      end.setblocking(False)
    signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
    self._previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    self.take_signals()
    directory = os.environ.get(processes.HEARTBEAT_DIR_ENV)
    if directory and os.path.isdir(directory):
      self._heartbeat = os.path.join(directory, str(self._process_id))
    self._thread = threading.Thread(target=self._watch, name="tf_tput-watchdog",
                                    daemon=True)
    self._thread.start()
    return self

  def take_signals(self) -> None:
    """(Re)installs the handlers: jax.distributed's preemption notifier takes SIGTERM
    for itself when it starts, so the run takes it back once its devices resolve."""
    for sig in SIGNALS:
      signal.signal(sig, self._on_signal)

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._note(signum)

  def _note(self, signum: int) -> None:
    if self.signum is None:
      self.signum, self._signalled_at = signum, time.monotonic()

  def should_stop(self) -> bool:
    return self.signum is not None

  def watch(self, measurement) -> None:
    """From now on, bound the windows of `measurement` (loop.run fills it); None once
    the loop has returned (what follows it is no window)."""
    self._measurement = measurement

  def __enter__(self) -> "Watchdog":
    return self.install()

  def __exit__(self, *raised) -> bool:
    self.close()
    return False  # what was raised goes on

  def end(self, measurement, stage: str) -> int:
    """The main thread's ending of the run, once it is done: no more windows to
    bound; interrupted if a signal came (signal_ending); then finish(ending) here,
    unless the thread claimed the ending first, when it ends the process (this waits
    for that). The exit code."""
    self.watch(None)
    ending = None if self.signum is None else self.signal_ending(measurement, stage)
    if not self.claim():
      while True:  # the thread writes the ending and ends the process
        time.sleep(POLL_S)
    return self._finish(ending, False)

  def claim(self) -> bool:
    """True once: the caller writes the ending; anyone later must not."""
    return self._claim.acquire(blocking=False)

  def close(self) -> None:
    """Stops watching. The handlers before install() come back, unless a signal is
    ending the run: then more of them are ignored while the process exits (the
    interpreter's shutdown would restore their default, death, and another exit code)."""
    self._closed.set()
    if self._thread is not None:
      self._thread.join()
      signal.set_wakeup_fd(-1)
      self._reader.close()
      self._writer.close()
    for sig, previous in self._previous.items():
      if self.signum is not None:
        previous = signal.SIG_IGN
      signal.signal(sig, signal.SIG_DFL if previous is None else previous)  # None: C's
    if self._heartbeat:
      _remove(self._heartbeat)

  # The thread's side.
  def _watch(self) -> None:
    last_beat = 0.0
    while not self._closed.is_set():
      ready, _, _ = select.select([self._reader], [], [], POLL_S)
      if ready:
        try:
          for byte in self._reader.recv(64):
            if byte in [int(s) for s in SIGNALS]:
              self._note(byte)
        except BlockingIOError:
          pass
      now = time.monotonic()
      if self._heartbeat and now - last_beat >= HEARTBEAT_S:
        self._beat()
        last_beat = now
      if self.signum is not None and now - self._signalled_at > GRACE_S:
        self._end_here(self._stuck_interrupt())
      hung = self._hung()
      if hung:
        self._end_here(hung)

  def _end_here(self, ending: Ending) -> None:
    """The main thread is stuck: write the ending from here and end the process."""
    if not self.claim():
      return  # the main thread is writing it
    try:
      code = self._finish(ending, True)
    except BaseException as e:  # noqa: BLE001 - whatever happens, the process must end
      print(f"error: {ending.error}; its record could not be written ({e})",
            file=sys.stderr)
      code = ending.exit_code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the main thread cannot be unwound: it is blocked outside Python

  def steps_done(self) -> int:
    m = self._measurement
    return len(m.completion_times) * m.sync_every if m is not None else 0

  def signal_ending(self, measurement, stage: str, note: str = "") -> Ending:
    """What the signal ends the run as: interrupted; or failed where tf_tput.launch
    stops this process because another one failed (it says so in the heartbeat
    directory first: processes.STOP_REASON_FILE)."""
    reason = self._stop_reason()
    if reason is None:
      return interrupted(self.signum, progress(measurement, stage) + note)
    return Ending("failed", f"step {measurement.steps_completed}: {reason}, and "
                  f"tf_tput.launch stopped this process ({signal_name(self.signum)}, "
                  f"stage {stage}){note}", 1)

  def _stop_reason(self) -> Optional[str]:
    if not self._heartbeat:
      return None
    path = os.path.join(os.path.dirname(self._heartbeat), processes.STOP_REASON_FILE)
    try:
      with open(path) as f:
        return f.read().strip() or None
    except OSError:
      return None

  def _stuck_interrupt(self) -> Ending:
    measurement, stage = self._progress()
    return self.signal_ending(measurement, stage,
                              note=why_stuck(stage, self._num_processes))

  def _hung(self) -> Optional[Ending]:
    m = self._measurement  # read once: the main thread may unset it meanwhile
    if m is None or m.error or m.loop_started is None:
      return None
    starts = [m.loop_started] + list(m.completion_times)
    durations = [b - a for a, b in itertools.pairwise(starts)]
    waited, bound = loop.CLOCK() - starts[-1], window_bound(durations, self._step_timeout_s)
    if waited <= bound:
      return None
    how = (f"--step_timeout_s={self._step_timeout_s:g}" if self._step_timeout_s
           else "derived from the steps so far; --step_timeout_s sets it")
    return Ending("failed", f"step {self.steps_done()}: hung: its window did "
                  f"not end within {bound:g} s ({how}); waited {waited:.1f} s; "
                  f"{self._silent_peers()}", 1)

  def _beat(self) -> None:
    try:
      with open(self._heartbeat + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {self.steps_done()}\n")
      os.replace(self._heartbeat + ".tmp", self._heartbeat)
    except OSError:
      pass  # a heartbeat only helps name a hung peer

  def _silent_peers(self) -> str:
    """Which processes of this launch stopped beating, where heartbeats are kept."""
    if not self._heartbeat:
      return "which process hung is not known here (heartbeats need tf_tput.launch)"
    directory, now, silent = os.path.dirname(self._heartbeat), time.time(), []
    for name in sorted(os.listdir(directory)):
      path = os.path.join(directory, name)
      try:
        age = now - os.path.getmtime(path)
        with open(path) as f:
          pid, steps = f.read().split()
      except (OSError, ValueError):
        continue
      if name.isdigit() and age > SILENT_S:
        silent.append(f"process {name} (pid {pid}) silent for {age:.0f} s, last at step "
                      f"{steps}, stopped or blocked")
    return "; ".join(silent) or "every process still answers: a collective hung"


def _launched_processes() -> int:
  try:
    return topology.launched_processes()[0]
  except UsageError:  # two launchers claim it: train.py says so before any watchdog
    return 1


def _remove(path: str) -> None:
  try:
    os.unlink(path)
  except OSError:
    pass
