r"""One TF worker: a tf.distribute.Server for the task TF_CONFIG names.

    TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:P0"], "worker": ["127.0.0.1:P1"]},
                "task": {"type": "worker", "index": 0}}' \
        python -m tf_tput.systems.tensorflow.server --devices=2

The cluster, this task's job and index come from TF_CONFIG, read as tf.distribute's
TFConfigClusterResolver reads it in any TF multi-worker job; the server exposes
--devices logical CPU devices (ConfigProto device_count), and any GPUs TF finds.

Started by hand (or by a cluster's own launcher), it serves TF_CONFIG's chief until
the chief has come and gone, then exits 0; a chief that never serves within
--cluster_timeout_s is one error line, exit 1. A train command run as a worker task
does the same (runtime.serve_worker): both wait in cluster.serve_until_chief_leaves.

tf_tput.launch (--num_workers) and the TF micro-benchmark start one per worker with
--lifetime_s and stop it when their run ends, whatever their command (which need not
be a chief that serves). It never outlives its starter: it exits when its parent
process is gone (the starter was killed before it could stop it) or after
--lifetime_s seconds, whichever comes first.

TensorFlow's gRPC server listens on 0.0.0.0:PORT (all interfaces, dual-stack) whatever
host the cluster spec names: grpc_server_lib.cc hard-codes the wildcard address and
offers no option to change it. Peers and the client only ever connect to 127.0.0.1.
"""

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
import types

from tf_tput.errors import UsageError
from tf_tput.systems.tensorflow import cluster

WATCH_PERIOD_S = 0.5
READY_MARKER = "serving grpc://"  # printed once the server listens; starters wait for it
# What TF prints at start-up before absl logging honours TF_CPP_MIN_LOG_LEVEL (its CPU
# feature notice's second line, CUDA and TensorRT warnings, XLA's CUDA plugin
# registrations), never why a process failed: the TF runtime's startup_noise, left
# out of a log's tail (runtime.processes.log_tail; absl's own lines are left out there).
STARTUP_NOISE = ("To enable the", r"W\d{4} .*(cuda|TensorRT)", r"E\d{4} .*cuda")


def _exit_when_orphaned_or_expired(parent_pid: int, lifetime_s: float) -> None:
  """A daemon thread that ends this process once its parent is gone or time is up."""
  give_up = time.monotonic() + lifetime_s

  def watch():
    while os.getppid() == parent_pid and time.monotonic() < give_up:
      time.sleep(WATCH_PERIOD_S)
    os._exit(0)  # server.join() never returns; leave without waiting for it

  threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _parse_args(argv) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--devices", type=int, default=1,
                      help="logical CPU devices this worker exposes (default 1)")
  parser.add_argument("--lifetime_s", type=float, default=None,
                      help="for a starter that stops this server (tf_tput.launch, the "
                      "micro-benchmark): exit when the starter is gone or after this "
                      "many seconds, and watch no chief. Unset: serve TF_CONFIG's chief "
                      "until it has come and gone")
  parser.add_argument("--cluster_timeout_s", type=float, default=60.0,
                      help="without --lifetime_s: exit 1 when TF_CONFIG's chief does "
                      "not serve within this many seconds (default 60)")
  return parser.parse_args(argv)


def _chief_to_serve(args) -> str:
  """The chief this server waits for (started without --lifetime_s), checked before
  TensorFlow starts; UsageError naming what is wrong."""
  if not args.cluster_timeout_s > 0:
    raise UsageError(f"--cluster_timeout_s={args.cluster_timeout_s:g}; it must be > 0")
  if args.devices < 1:
    raise UsageError(f"--devices={args.devices}; it must be >= 1")
  chief, _ = cluster.parse_tf_config(os.environ.get(cluster.ENV, ""), as_worker=True)
  return chief


def main(argv=None) -> None:
  args = _parse_args(argv)
  chief = None
  if args.lifetime_s is not None:
    _exit_when_orphaned_or_expired(os.getppid(), args.lifetime_s)
  else:
    try:
      chief = _chief_to_serve(args)
    except UsageError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  cluster_spec, config_proto, server_class = _server_api()  # after the watch starts
  tf_config = json.loads(os.environ["TF_CONFIG"])
  job, index = tf_config["task"]["type"], int(tf_config["task"]["index"])
  server = server_class(cluster_spec(tf_config["cluster"]), job_name=job,
                        task_index=index, start=True,
                        config=config_proto(device_count={"CPU": args.devices}))
  # server.target is grpc://host:port: the line contains READY_MARKER.
  print(f"{job} {index} serving {server.target}" + (f" for the chief at {chief}"
                                                     if chief else ""), flush=True)
  if chief is None:
    server.join()  # never returns: the watch thread ends this process
  # The train command's workers wait the same way (runtime.serve_worker).
  code = cluster.serve_until_chief_leaves(chief, args.cluster_timeout_s)
  os._exit(code)  # as the watch thread does: the server's threads never end


def _server_api() -> tuple:
  """(ClusterSpec, ConfigProto, Server) without running tensorflow/__init__.py.

  A worker serves only what its client sends: it needs TensorFlow's runtime (the C++
  library server_lib loads) and these three classes, not the Python API that `import
  tensorflow` builds, which takes 3.3 s of CPU here against 0.4 s, in every worker a
  launch, a micro-benchmark or a test starts. The package is registered without its
  __init__ (TensorFlow's modules import each other by full name). Where that fails (a
  TensorFlow laid out otherwise), the plain import.
  """
  spec = importlib.util.find_spec("tensorflow")
  package = types.ModuleType("tensorflow")
  package.__path__ = list(spec.submodule_search_locations)
  package.__spec__, package.__file__ = spec, spec.origin
  sys.modules["tensorflow"] = package
  try:
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.training import server_lib
    return server_lib.ClusterSpec, config_pb2.ConfigProto, server_lib.Server
  except Exception:  # noqa: BLE001 - any failure: fall back to the whole import
    for name in [n for n in sys.modules if n.split(".")[0] == "tensorflow"]:
      del sys.modules[name]
    import tensorflow as tf
    return tf.train.ClusterSpec, tf.compat.v1.ConfigProto, tf.distribute.Server


if __name__ == "__main__":
  main()
