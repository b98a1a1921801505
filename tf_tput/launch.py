"""Starts a local multi-process run on loopback and stops every process it started.

    python -m tf_tput.launch --num_processes=2 -- \
        python -m tf_tput.train --system=jax --num_cpu_devices=2 ...

Each process gets TF_TPUT_COORDINATOR (127.0.0.1 and a free port), TF_TPUT_NUM_PROCESSES
and TF_TPUT_PROCESS_ID; tf_tput.topology joins them with jax.distributed. When any
process fails, the launcher names it, stops the others (SIGTERM, then SIGKILL after
--grace_s) and exits non-zero; Ctrl-C stops them all the same way.
"""

import sys

from absl import app
from absl import flags

from tf_tput import processes

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_processes", 2, "Processes to start, each running the command.")
flags.DEFINE_float("grace_s", 5.0, "Seconds between SIGTERM and SIGKILL when stopping.")
flags.DEFINE_float("timeout_s", None, "Stop everything and fail after this many seconds.")


def main(argv) -> int:
  command = argv[1:]
  if not command:
    print("error: no command to launch; put it after --, e.g. python -m tf_tput.launch "
          "--num_processes=2 -- python -m tf_tput.train --system=jax ...", file=sys.stderr)
    return 2
  if FLAGS.num_processes < 1:
    print(f"error: --num_processes={FLAGS.num_processes}; it must be >= 1", file=sys.stderr)
    return 2
  try:
    return processes.launch(command, FLAGS.num_processes, FLAGS.grace_s, FLAGS.timeout_s)
  except processes.StartError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  app.run(main)
