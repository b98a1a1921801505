"""One worker of the TF single-controller micro-benchmark: a tf.distribute.Server.

    python -m tf_tput.micro.tf_server --workers=127.0.0.1:P0,127.0.0.1:P1 --task=1 \
        --devices=2 --lifetime_s=330

tf_tput.micro.tf_single starts one per host and stops it when its run ends. The
server is task --task of job "worker" in a cluster whose task i listens on the i-th
address of --workers, with --devices logical CPU devices. It never outlives its
starter: it exits when its parent process is gone (the starter was killed before it
could stop it) or after --lifetime_s seconds, whichever comes first.

TensorFlow's gRPC server listens on 0.0.0.0:PORT (all interfaces, dual-stack) whatever
host the cluster spec names: grpc_server_lib.cc hard-codes the wildcard address and
offers no option to change it. Peers and the client only ever connect to 127.0.0.1.
"""

import argparse
import os
import threading
import time

WATCH_PERIOD_S = 0.5


def _exit_when_orphaned_or_expired(parent_pid: int, lifetime_s: float) -> None:
  """A daemon thread that ends this process once its parent is gone or time is up."""
  give_up = time.monotonic() + lifetime_s

  def watch():
    while os.getppid() == parent_pid and time.monotonic() < give_up:
      time.sleep(WATCH_PERIOD_S)
    os._exit(0)  # server.join() never returns; leave without waiting for it

  threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", required=True,
                      help="host:port of every worker, comma-separated, in task order")
  parser.add_argument("--task", type=int, required=True, help="this worker's index")
  parser.add_argument("--devices", type=int, required=True,
                      help="logical CPU devices this worker exposes")
  parser.add_argument("--lifetime_s", type=float, required=True,
                      help="exit after this many seconds even if nobody stops us")
  args = parser.parse_args(argv)
  _exit_when_orphaned_or_expired(os.getppid(), args.lifetime_s)

  import tensorflow as tf  # after the watch starts: the import alone takes seconds
  cluster = tf.train.ClusterSpec({"worker": args.workers.split(",")})
  config = tf.compat.v1.ConfigProto(device_count={"CPU": args.devices})
  server = tf.distribute.Server(cluster, job_name="worker", task_index=args.task,
                                config=config, start=True)
  print(f"worker {args.task} serving {server.target}", flush=True)
  server.join()


if __name__ == "__main__":
  main()
