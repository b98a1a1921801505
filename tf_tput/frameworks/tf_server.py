"""One TF worker: a tf.distribute.Server for the task TF_CONFIG names.

    TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:P0"], "worker": ["127.0.0.1:P1"]},
                "task": {"type": "worker", "index": 0}}' \
        python -m tf_tput.frameworks.tf_server --devices=2 --lifetime_s=3600

tf_tput.launch (--num_workers) and the TF micro-benchmark start one per worker and stop
it when their run ends. The cluster, this task's job and index come from TF_CONFIG
through tf.distribute's TFConfigClusterResolver, as in any TF multi-worker job; the
server exposes --devices logical CPU devices (ConfigProto device_count). It never
outlives its starter: it exits when its parent process is gone (the starter was killed
before it could stop it) or after --lifetime_s seconds, whichever comes first.

TensorFlow's gRPC server listens on 0.0.0.0:PORT (all interfaces, dual-stack) whatever
host the cluster spec names: grpc_server_lib.cc hard-codes the wildcard address and
offers no option to change it. Peers and the client only ever connect to 127.0.0.1.
"""

import argparse
import os
import threading
import time

WATCH_PERIOD_S = 0.5
READY_MARKER = "serving grpc://"  # printed once the server listens; starters wait for it


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
  parser.add_argument("--devices", type=int, required=True,
                      help="logical CPU devices this worker exposes")
  parser.add_argument("--lifetime_s", type=float, required=True,
                      help="exit after this many seconds even if nobody stops us")
  args = parser.parse_args(argv)
  _exit_when_orphaned_or_expired(os.getppid(), args.lifetime_s)

  import tensorflow as tf  # after the watch starts: the import alone takes seconds
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  config = tf.compat.v1.ConfigProto(device_count={"CPU": args.devices})
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                task_index=resolver.task_id, config=config, start=True)
  # server.target is grpc://host:port: the line contains READY_MARKER.
  print(f"{resolver.task_type} {resolver.task_id} serving {server.target}", flush=True)
  server.join()


if __name__ == "__main__":
  main()
