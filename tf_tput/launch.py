"""Starts a local multi-process run on loopback and stops every process it started.

    python -m tf_tput.launch --num_processes=2 -- \
        python -m tf_tput.train --system=jax --num_cpu_devices=2 ...

Each process gets TF_TPUT_COORDINATOR (127.0.0.1 and a free port), TF_TPUT_NUM_PROCESSES
and TF_TPUT_PROCESS_ID; tf_tput.topology joins them with jax.distributed. When any
process fails, the launcher names it, stops the others (SIGTERM, then SIGKILL after
--grace_s) and exits non-zero; Ctrl-C stops them all the same way.
"""

import os
import signal
import socket
import subprocess
import sys
import time

from absl import app
from absl import flags

from tf_tput import topology

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_processes", 2, "Processes to start, each running the command.")
flags.DEFINE_float("grace_s", 5.0, "Seconds between SIGTERM and SIGKILL when stopping.")
flags.DEFINE_float("timeout_s", None, "Stop everything and fail after this many seconds.")

POLL_S = 0.2


def free_loopback_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def stop(procs: list, grace_s: float) -> None:
  """SIGTERM to each still-running process group, then SIGKILL whatever remains."""
  for p in procs:
    if p.poll() is None:
      _signal_group(p, signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      _signal_group(p, signal.SIGKILL)
      p.wait()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(p.pid, sig)  # the child and anything it started
  except ProcessLookupError:
    pass


def launch(command: list, num_processes: int, grace_s: float,
           timeout_s: float = None) -> int:
  coordinator = f"127.0.0.1:{free_loopback_port()}"
  procs = []
  interrupted = []

  def on_signal(signum, frame):
    del frame
    interrupted.append(signum)

  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    for index in range(num_processes):
      env = dict(os.environ, **{topology.COORDINATOR_ENV: coordinator,
                                topology.NUM_PROCESSES_ENV: str(num_processes),
                                topology.PROCESS_ID_ENV: str(index)})
      procs.append(subprocess.Popen(command, env=env, start_new_session=True))
    started = time.monotonic()
    while True:
      if interrupted:
        stop(procs, grace_s)
        print(f"error: interrupted by signal {interrupted[0]}; stopped all "
              f"{num_processes} processes", file=sys.stderr)
        return 128 + interrupted[0]
      codes = [p.poll() for p in procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        index, code = failed[0]
        stop(procs, grace_s)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        print(f"error: process {index} (pid {procs[index].pid}) {how}; stopped the other "
              f"{num_processes - 1}", file=sys.stderr)
        return 1
      if all(c == 0 for c in codes):
        return 0
      if timeout_s is not None and time.monotonic() - started > timeout_s:
        stop(procs, grace_s)
        print(f"error: --timeout_s={timeout_s} passed; stopped all {num_processes} "
              "processes", file=sys.stderr)
        return 1
      time.sleep(POLL_S)
  finally:
    stop(procs, grace_s)  # no orphans, whatever happened above
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def main(argv) -> int:
  command = argv[1:]
  if not command:
    print("error: no command to launch; put it after --, e.g. python -m tf_tput.launch "
          "--num_processes=2 -- python -m tf_tput.train --system=jax ...", file=sys.stderr)
    return 2
  if FLAGS.num_processes < 1:
    print(f"error: --num_processes={FLAGS.num_processes}; it must be >= 1", file=sys.stderr)
    return 2
  return launch(command, FLAGS.num_processes, FLAGS.grace_s, FLAGS.timeout_s)


if __name__ == "__main__":
  app.run(main)
