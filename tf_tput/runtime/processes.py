"""Local processes on loopback: start them, watch them, stop them all.

Shared by tf_tput.launch (the command-line launcher) and the micro-benchmarks.
launch(): N copies of a command (JAX processes); each gets TF_TPUT_COORDINATOR
(127.0.0.1 and a free port), TF_TPUT_NUM_PROCESSES and TF_TPUT_PROCESS_ID
(tf_tput.runtime.topology reads them); tf_tput.systems.tensorflow.workers.launch()
starts a TF cluster with these helpers. When any process fails, it is named and the others
are stopped (SIGTERM to its process group, then SIGKILL); Ctrl-C and SIGTERM stop them
all the same way.
"""

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tf_tput.records import build

# Set for each process launch() starts, and for the command run_with_servers() drives
# the servers with; tf_tput.runtime.launchers reads them.
COORDINATOR_ENV = "TF_TPUT_COORDINATOR"
NUM_PROCESSES_ENV = "TF_TPUT_NUM_PROCESSES"
PROCESS_ID_ENV = "TF_TPUT_PROCESS_ID"
# The run id every process of one run records and logs (launchers.run_id): set by
# launch() for its processes, and by tf_tput.suite for each run it starts.
RUN_ID_ENV = "TF_TPUT_RUN_ID"
# Where launch()'s processes keep their heartbeats (runtime/watchdog.py reads it): a
# hung run's record can then name the process that stopped answering.
HEARTBEAT_DIR_ENV = "TF_TPUT_HEARTBEAT_DIR"
# Written there before the launcher stops the others because one process failed: why
# (a run that then ends records a failure, not an interruption).
STOP_REASON_FILE = "stopping"

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Lines of a child's log that never say why it failed, whatever it runs: blank ones,
# and absl's C++ logging (native libraries' logs, before and after a process sets up
# its logging: the banner, pre-initialisation lines, info lines). Patterns matched at
# a line's start; a framework's own notices are its runtime's startup_noise
# (tf_tput.runtime.Runtime), which the caller passes to log_tail.
LOG_NOISE = (r"^\s*$", r"WARNING: All log messages before absl", r"[IWE]0000 ", r"I\d{4} ")

POLL_S = 0.2
COMMAND_PREFIX = "$ "  # a child's log opens with its command line (tf_tput.suite)


class StartError(OSError):
  """The command could not be started at all."""


def bind_to_parent() -> None:
  """In the child: be killed if the launcher dies, even by SIGKILL (Linux).

  SIGKILL, not SIGTERM: a dead launcher cannot escalate after a grace period, and a
  process of a jax.distributed run ignores SIGTERM (its preemption notifier takes
  it); one blocked in a collective whose peer is gone would otherwise run forever.
  The launcher's own stop() still sends SIGTERM first."""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path, lines: int, empty: str, noise: tuple = ()) -> str:
  """The last `lines` meaningful lines of a child's log file, joined on one line:
  neither LOG_NOISE nor `noise` (patterns matched at a line's start: the startup_noise
  of the runtimes whose frameworks the child loaded)."""
  skipped = re.compile("|".join(f"(?:{pattern})" for pattern in (*LOG_NOISE, *noise)))
  try:
    with open(path, "rb") as f:
      text = f.read().decode(errors="replace")
  except OSError:
    return "(no log)"
  # Not the command the log opens with ("$ ..."): the caller names the run, and an
  # srun or launch command line is long enough to fill the tail.
  kept = [line.strip() for line in text.splitlines()
          if not skipped.match(line) and not line.startswith(COMMAND_PREFIX)]
  return " | ".join(kept[-lines:])[-600:] or empty


def free_loopback_ports(count: int) -> list:
  """count distinct ports free on 127.0.0.1 now (a later bind can still lose a race)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sockets.append(s)
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def busy_ports(ports) -> list:
  """The ports of `ports` that something already listens on, on any address
  (some servers bind the wildcard whatever address they are given)."""
  busy = []
  for port in ports:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
      s.bind(("", port))
    except OSError:
      busy.append(port)
    finally:
      s.close()
  return busy


def free_loopback_port() -> int:
  return free_loopback_ports(1)[0]


def stop(procs: list, grace_s: float) -> None:
  """SIGTERM to each still-running process group, then SIGKILL whatever remains.

  A Ctrl-C while waiting out the grace SIGKILLs them all at once, then propagates.
  """
  try:
    for p in procs:
      if p.poll() is None:
        _signal_group(p, signal.SIGTERM)
        _signal_group(p, signal.SIGCONT)  # a stopped (paused) process handles it too
    deadline = time.monotonic() + grace_s
    for p in procs:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        _signal_group(p, signal.SIGKILL)
        p.wait()
  except KeyboardInterrupt:
    for p in procs:
      _signal_group(p, signal.SIGKILL)
    for p in procs:
      p.wait()
    raise


def _signal_group(p: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(p.pid, sig)  # the child and anything it started
  except ProcessLookupError:
    pass


def popen(command: list, die_with_parent: bool = True, **kwargs) -> subprocess.Popen:
  """Starts `command` in its own session (so its whole group can be signalled)."""
  try:
    return subprocess.Popen(command, start_new_session=True,
                            preexec_fn=bind_to_parent if die_with_parent else None,
                            **kwargs)
  except OSError as e:
    raise StartError(f"cannot start {command[0]!r}: {e.strerror}") from None


@contextlib.contextmanager
def recording_signals():
  """Within: SIGINT/SIGTERM are appended to the yielded list instead of acting."""
  interrupted = []

  def on_signal(signum, frame):
    del frame
    interrupted.append(signum)

  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield interrupted
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def how(code: int) -> str:
  return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def launch(command: list, num_processes: int, grace_s: float,
           timeout_s: float = None, reraise_interrupt: bool = False,
           network=None, env_of=None) -> int:
  """Runs `command` in num_processes processes; 0 when all succeed.

  With `network` (a runtime.islands.IslandNetwork) the processes split into its
  islands in order, each started inside its island, the coordinator on island 0's
  address; otherwise on loopback, inside `network` when it is a
  runtime.namespaces.PrivateNetwork. env_of(index), when given, adds variables to a
  process's environment (a TF_CONFIG each).
  On Ctrl-C / SIGTERM every process is stopped, then the exit code is 128 + signal,
  or KeyboardInterrupt is raised when the caller has more to stop (reraise_interrupt).
  """
  host = network.islands[0].address if network and network.islands else "127.0.0.1"
  coordinator = f"{host}:{free_loopback_port()}"  # a namespace's ports are all free
  procs = []
  heartbeats = tempfile.mkdtemp(prefix="tf_tput-heartbeats-")
  with recording_signals() as interrupted:
    try:
      return _run_copies(command, num_processes, grace_s, timeout_s, reraise_interrupt,
                         coordinator, procs, interrupted, network,
                         lambda i: {HEARTBEAT_DIR_ENV: heartbeats,
                                    **(env_of(i) if env_of else {})}, heartbeats)
    finally:
      stop(procs, grace_s)  # no orphans, whatever happened
      shutil.rmtree(heartbeats, ignore_errors=True)


def _run_copies(command, num_processes, grace_s, timeout_s, reraise_interrupt,
                coordinator, procs, interrupted, network, env_of, heartbeats) -> int:
  islands = network.islands if network else []
  run_id = os.environ.get(RUN_ID_ENV) or build.new_run_id()  # one run, one id
  for index in range(num_processes):
    env = dict(os.environ, **{COORDINATOR_ENV: coordinator,
                              NUM_PROCESSES_ENV: str(num_processes),
                              PROCESS_ID_ENV: str(index), RUN_ID_ENV: run_id})
    env.update(env_of(index) if env_of else {})
    prefix = []
    if islands:
      island = network.island_of(index, num_processes)
      env.update(network.process_env(island))
      prefix = island.exec_prefix()
    elif network:  # one private namespace
      prefix = network.exec_prefix()
    procs.append(popen(prefix + list(command), env=env))
  started = time.monotonic()
  while True:
    if interrupted:
      stop(procs, grace_s)
      if reraise_interrupt:
        raise KeyboardInterrupt
      print(f"error: interrupted by signal {interrupted[0]}; stopped all "
            f"{num_processes} processes", file=sys.stderr)
      return 128 + interrupted[0]
    codes = [p.poll() for p in procs]
    failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
    if failed:
      index, code = failed[0]
      where = (f" in island {network.island_of(index, num_processes).index}"
               if islands else "")
      _say_why(heartbeats, f"process {index} (pid {procs[index].pid}){where} {how(code)}")
      stop(procs, grace_s)
      print(f"error: process {index} (pid {procs[index].pid}){where} {how(code)}; "
            f"stopped the other {num_processes - 1}", file=sys.stderr)
      return 1
    if all(c == 0 for c in codes):
      return 0
    if timeout_s is not None and time.monotonic() - started > timeout_s:
      _say_why(heartbeats, f"tf_tput.launch --timeout_s={timeout_s:g} passed")
      stop(procs, grace_s)
      print(f"error: --timeout_s={timeout_s} passed; stopped all {num_processes} "
            "processes", file=sys.stderr)
      return 1
    time.sleep(POLL_S)


def _say_why(heartbeats: str, reason: str) -> None:
  """Tells the processes about to be stopped why (runtime/watchdog.py reads it)."""
  try:
    with open(os.path.join(heartbeats, STOP_REASON_FILE), "w") as f:
      f.write(reason + "\n")
  except OSError:
    pass  # they record an interruption instead


def read_log(path) -> str:
  """A child's log file so far; "" before it exists."""
  try:
    with open(path, "rb") as f:
      return f.read().decode(errors="replace")
  except OSError:
    return ""


def wait_for_marker(servers, logs: dict, marker: str, deadline: float, late,
                    interrupted=lambda: False) -> None:
  """Returns once every log of `logs` ({server index: its log file}) holds `marker`
  (what a server prints once it serves). RuntimeError naming the first of `servers`
  (exited(), describe(): watch_command's) to exit; at time.monotonic() `deadline`,
  TimeoutError(late(the indices still waiting)); KeyboardInterrupt once
  interrupted() says so."""
  waiting = set(logs)
  while True:
    if interrupted():
      raise KeyboardInterrupt
    exited = servers.exited()
    if exited:
      raise RuntimeError(servers.describe(exited[0]))
    waiting = {i for i in waiting if marker not in read_log(logs[i])}
    if not waiting:
      return
    if time.monotonic() >= deadline:
      raise TimeoutError(late(sorted(waiting)))
    time.sleep(POLL_S / 4)


def run_with_servers(servers, noun: str, count: int, start, command: list, env: dict,
                     grace_s: float, timeout_s, loss_grace_s: float) -> int:
  """Starts `count` servers (TF workers, Ray nodes: `noun`), then `command` with `env`
  as the process that drives them, and returns its exit code (watch_command).
  start(interrupted) returns once they serve, with what the command's environment
  needs of them beyond `env` (or None), or raises RuntimeError / TimeoutError (then:
  one error line, exit 1). Ctrl-C / SIGTERM: 128 + signal. However it ends,
  the command is stopped, then servers.stop(grace_s)."""
  driver = []
  with recording_signals() as interrupted:
    try:
      served = start(lambda: bool(interrupted)) or {}
      # The driver is one process tf_tput.launch started (runtime/launchers.py).
      driver.append(popen(command, env=dict(env, **served, **{NUM_PROCESSES_ENV: "1",
                                                               PROCESS_ID_ENV: "0"})))
      return watch_command(driver[0], servers, f"the {noun}", timeout_s, interrupted,
                           loss_grace_s)
    except (RuntimeError, TimeoutError) as e:
      print(f"error: {e}; stopped all {count} {noun}", file=sys.stderr)
      return 1
    except KeyboardInterrupt:
      print(f"error: interrupted by signal {interrupted[0]}; stopped the command and "
            f"all {count} {noun}", file=sys.stderr)
      return 128 + interrupted[0]
    finally:
      stop(driver, grace_s)  # no orphans, whatever happened
      servers.stop(grace_s)


def watch_command(command, servers, what: str, timeout_s, interrupted: list,
                  loss_grace_s: float) -> int:
  """Waits for `command` (a process driving `servers`: TF workers, Ray nodes) and
  returns its exit code. `servers` has exited() -> [(index, code)] and
  describe((index, code)) -> text; `what` names them ("the workers"). A server that
  exits is remembered, and the command gets loss_grace_s to notice and record the
  failure before it is given up on (exit 1); --timeout_s likewise; a signal in
  `interrupted` raises KeyboardInterrupt. The caller stops everything."""
  started = time.monotonic()
  lost, lost_at = None, None
  while True:
    if interrupted:
      raise KeyboardInterrupt
    code = command.poll()
    if code is not None:
      if code:
        cause = f" after {servers.describe(lost)}" if lost else ""
        print(f"error: the command (pid {command.pid}) {how(code)}{cause}; "
              f"stopped {what}", file=sys.stderr)
      return code if code >= 0 else 128 - code
    if lost is None and servers.exited():
      lost, lost_at = servers.exited()[0], time.monotonic()
    if lost is not None and time.monotonic() - lost_at > loss_grace_s:
      print(f"error: {servers.describe(lost)}, and the command did not end within "
            f"{loss_grace_s:g} s; stopped it", file=sys.stderr)
      return 1
    if timeout_s is not None and time.monotonic() - started > timeout_s:
      print(f"error: --timeout_s={timeout_s:g} passed; stopped the command and "
            f"{what}", file=sys.stderr)
      return 1
    time.sleep(POLL_S)
