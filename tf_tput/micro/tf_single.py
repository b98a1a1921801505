"""TF single controller: one client Session drives every host's devices (the paper's TF).

Hosts. Each host is a `tf.distribute.Server` in its own process
(tf_tput.systems.tensorflow.server through tf_tput.systems.tensorflow.workers: job
"worker", task i from TF_CONFIG, devices_per_host logical CPU devices from
ConfigProto(device_count={"CPU": k})), on a free port of 127.0.0.1. run() starts them in their own sessions, waits (within spec.timeout_s)
until each prints that it serves, checks with Session.list_devices() that every
/job:worker/task:i/device:CPU:j exists, and stops them all in a finally: SIGTERM to
each process group, SIGKILL after STOP_GRACE_S; on success, on any exception, on
timeout and on KeyboardInterrupt. A server whose starter dies without that finally
exits by itself (see tf_server).

Loopback. Every address in the cluster, and the client's target, is 127.0.0.1, but
TensorFlow's gRPC server listens on the wildcard address 0.0.0.0:PORT ([::] dual-stack)
whatever the cluster spec says: grpc_server_lib.cc hard-codes it and neither
tf.distribute.Server nor ServerDef can restrict it. So tf_tput.micro runs each
measurement through run_private(): a child process inside a private network namespace
with nothing but loopback (runtime.namespaces.PrivateNetwork) runs run() there, the
client and its servers together, and hands the seconds back through a pipe; nothing
outside the namespace reaches the servers. The child and its namespace serve every
measurement of the invocation (one TensorFlow import, ~3 s, instead of one per
measurement; each measurement still starts servers of its own) until close().
run() itself, called in this process (as the tests do, and tf_tput.micro
--expose_servers), leaves the servers' ports reachable from other machines that can
reach this one, unauthenticated, while the run lasts.

Client. The calling process holds one tf.compat.v1.Session on grpc://<worker 0> and
builds, in its own tf.Graph, ops placed on /job:worker/replica:0/task:i/device:CPU:j.
The session passes no cluster_def: the servers already share the cluster, and TF 2.21
rejects a session cluster_def that names the master's own job and task ("The
ClusterSpec names the job and task index to be the same names that were provided when
the server booted"). Calls go through Session.make_callable (one RunCallable RPC to the
master per call, no per-call fetch bookkeeping in Python).

The AllReduce is an explicit reduction across device placements, not TF collective
ops: add_n of every device's x on the first device (task 0, CPU 0), then every device
computes sum // num_devices + 1 on its own placement, so the sum travels to every
device. The master's graph partitioner turns each cross-device edge into a Send/Recv
pair (gRPC RecvTensor between workers), which is exactly what a single controller's
dataflow graph does, and it works unchanged in all three modes, inside a while loop
included, with no extra configuration. TF collective ops do work here too
(tf.raw_ops.CollectiveReduce, one per device, with
experimental.collective_group_leader set in every server's and the session's config;
a quick trial with 2 hosts ran all three modes correctly) but were slower: about 280
vs 450 computations/s OpByOp, 1140 vs 1400-1800 Chained, 450 vs 900-1300 Fused. On
CPU their ring travels the same gRPC RecvTensor path, with more hops per reduction.

Modes. State is one int32 variable per device, x_<task>_<index> (plus, with
spec.matmul_n, one n x n float32 variable of ones a_<task>_<index> per device, read
afresh by each computation after the previous one so that no graph optimizer shares
one matmul between computations; 1 when (A @ A)[0, 0] equals n, as it does exactly,
is added to x).
Variables live in the workers' shared resource state, as TF1 variables always did;
another session on the cluster sees them.
  opbyop   one call runs a graph of one computation that assigns the new values;
  chained  one call runs a graph of chain_length chained computations, built once,
           that reads the variables and assigns the final values;
  fused    one call runs one tf.compat.v1.while_loop of chain_length iterations whose
           body is one computation across all devices. The loop is built with TF1
           control flow (Enter/Merge/Switch dataflow, toggled on for the build only and
           restored): the partitioner splits one frame across workers, each iteration
           costs only the loop predicate's and the data's Send/Recv. Control flow v2's
           While op, which the session lowers to the same primitives, measured 10-20%
           slower with 2 hosts here. No XLA: an XLA cluster lives on one device, so it
           cannot compile a loop whose body spans devices of several workers; at most
           it would compile single-device fragments of a body of scalar ops, adding
           launch overhead rather than removing it.

Checks and timing. After every repeat (the untimed warmup included) the client reads
every device's x back and micro.check()s it against micro.expected() of the number
of computations run so far. Each repeat is timed with time.perf_counter around its
spec.calls_per_repeat calls; a call returns when its step has completed on every
worker.

Timeout. spec.timeout_s bounds the whole run: the servers' start-up waits for it, the
session's operation_timeout_in_ms (CreateSession, ListDevices, MakeCallable) and each
call's RunOptions.timeout_in_ms are the time left. Running out raises TimeoutError; a
worker that dies raises RuntimeError with the end of its log. Clean-up comes on top:
at most CLOSE_WAIT_S for the session's close and STOP_GRACE_S for the servers.
"""

import atexit
import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import tf_tput
from tf_tput import micro
from tf_tput.errors import UsageError
from tf_tput.runtime import namespaces, processes
from tf_tput.systems.tensorflow import cluster as cluster_lib, workers as tf_workers

MODES = ("opbyop", "chained", "fused")
JOB = cluster_lib.WORKER
STOP_GRACE_S = 3.0
CLOSE_WAIT_S = 2.0                  # a session close that hangs is left behind after this
LIFETIME_MARGIN_S = 30.0            # servers exit on their own this long after the deadline
CLIENT_MODULE = "tf_tput.micro.tf_single"  # run_private's child: run() in the namespace
# Errors of run_private's child that keep their type here (others: RuntimeError).
_ERROR_TYPES = {"CheckError": micro.CheckError, "TimeoutError": TimeoutError,
                "UsageError": UsageError}


def unavailable():
  """TensorFlow is a core dependency: the TF system is always available."""
  return None


def device_names(spec) -> list:
  return [f"/job:{JOB}/replica:0/task:{task}/device:CPU:{index}"
          for task in range(spec.hosts) for index in range(spec.devices_per_host)]


def variable_name(device: str, prefix: str = "x") -> str:
  """The name (and worker-side shared name) of a device's variable: x_<task>_<index>."""
  task = device.split("/task:")[1].split("/")[0]
  return f"{prefix}_{task}_{device.rsplit(':', 1)[1]}"


def run(spec) -> list:
  """Wall seconds of each of spec.repeats timed repeats; see the module docstring."""
  _validate(spec)
  deadline = time.monotonic() + spec.timeout_s
  with tempfile.TemporaryDirectory(prefix="tf_tput_micro_tf_") as log_dir:
    lifetime_s = spec.timeout_s + LIFETIME_MARGIN_S
    cluster = tf_workers.WorkerProcesses(
        tf_workers.loopback_cluster(spec.hosts, with_chief=False),
        spec.devices_per_host, log_dir, lifetime_s)
    try:
      cluster.start()
      # Imported (the first time: in run_private's child) and built while the
      # servers import TensorFlow.
      import tensorflow as tf
      program = _Program(tf, spec)
      cluster.wait_until_serving(deadline, f"timeout_s={spec.timeout_s}")
      config = tf.compat.v1.ConfigProto(
          operation_timeout_in_ms=_remaining_ms(deadline, spec))
      session = tf.compat.v1.Session(f"grpc://{cluster.addresses[0]}", graph=program.graph,
                                     config=config)
      try:
        _check_devices(session, program.devices)
        return _measure(tf, session, program, spec, deadline)
      finally:
        cluster_lib.close_session(session, CLOSE_WAIT_S)
    except Exception as e:
      tf = sys.modules.get("tensorflow")
      explained = (_explain(tf, e, cluster, spec, deadline)
                   if tf and isinstance(e, tf.errors.OpError) else None)
      if explained is None:
        raise
      raise explained from e
    finally:
      cluster.stop(STOP_GRACE_S)


def run_private(spec) -> list:
  """run(spec) in a child process inside a private network namespace with nothing but
  loopback: the same client, servers and timing, out of other machines' reach. Needs
  root and iproute2 (UsageError otherwise). The child stays for the next spec until
  close() or a spec that fails (its error, out of time, the child dead, Ctrl-C): then
  it is stopped, its servers with it, and the next spec starts a fresh one."""
  global _client
  _validate(spec)
  if _client is None:
    _client = _PrivateClient()
  try:
    result = _client.ask(spec)
  except BaseException:
    close()
    raise
  if "error" in result:
    close()  # a fresh client for what comes next: nothing of a failed run stays
    kind = _ERROR_TYPES.get(result["type"])
    raise (kind(result["error"]) if kind else
           RuntimeError(f"{result['type']}: {result['error']}"))
  return result["repeat_seconds"]


def close() -> None:
  """Stops run_private's child (SIGTERM: it stops its servers) and removes its
  namespace; tf_tput.micro calls it once its runs are done, and at exit it runs."""
  global _client
  client, _client = _client, None
  if client is not None:
    client.close()


class _PrivateClient:
  """run_private's child (main() below) and its namespace: a spec as one JSON line in,
  its result as one JSON line out."""

  def __init__(self):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tf_tput.REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    self._stack = contextlib.ExitStack()
    with self._stack:  # a start that fails part-way undoes what it did
      network = self._stack.enter_context(namespaces.PrivateNetwork())
      self._proc = processes.popen(
          network.exec_prefix() + [sys.executable, "-m", CLIENT_MODULE], env=env,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
      self._stack.callback(processes.stop, [self._proc],  # before the namespace goes
                           STOP_GRACE_S + CLOSE_WAIT_S + 1)
      self._stack = self._stack.pop_all()

  def ask(self, spec) -> dict:
    try:
      self._proc.stdin.write(json.dumps(dataclasses.asdict(spec)) + "\n")
      self._proc.stdin.flush()
    except BrokenPipeError:
      pass  # it has died: the read below says how
    ready, _, _ = select.select([self._proc.stdout], [], [],
                                spec.timeout_s + LIFETIME_MARGIN_S)
    if not ready:
      raise TimeoutError(f"tf: the run passed timeout_s={spec.timeout_s} by "
                         f"{LIFETIME_MARGIN_S:g} s ({spec.mode}, hosts={spec.hosts})")
    line = self._proc.stdout.readline()
    try:
      return json.loads(line)
    except ValueError:
      raise RuntimeError(f"tf: the client in the private network namespace "
                         f"{processes.how(self._proc.wait())} without a result; see its "
                         "output above") from None

  def close(self) -> None:
    self._stack.close()


_client = None  # run_private's _PrivateClient, once started
atexit.register(close)


def _validate(spec) -> None:
  if spec.mode not in MODES:
    raise UsageError(f"tf: mode {spec.mode!r} is not one of {', '.join(MODES)}")
  for name in ("hosts", "devices_per_host", "chain_length", "computations", "repeats"):
    if getattr(spec, name) < 1:
      raise UsageError(f"tf: {name}={getattr(spec, name)}; it must be >= 1")
  if spec.mode != "opbyop" and spec.computations % spec.chain_length:
    raise UsageError(f"tf: computations={spec.computations} is not a multiple of "
                     f"chain_length={spec.chain_length}; make it one")
  if spec.matmul_n < 0:
    raise UsageError(f"tf: matmul_n={spec.matmul_n}; it must be >= 0")
  if not spec.timeout_s > 0:
    raise UsageError(f"tf: timeout_s={spec.timeout_s}; it must be > 0")


def _remaining_ms(deadline: float, spec) -> int:
  """Milliseconds left until the run's deadline; TimeoutError naming spec.timeout_s
  when none are."""
  left = deadline - time.monotonic()
  if left <= 0:
    raise TimeoutError(f"tf: the run passed its timeout_s={spec.timeout_s}")
  return max(1, int(left * 1000))


class _Program:
  """The client's graph: one int32 variable per device and the step one call runs."""

  def __init__(self, tf, spec):
    self.devices = device_names(spec)
    self.graph = tf.Graph()
    with self.graph.as_default():
      xs, matrices = [], []
      for device in self.devices:
        with tf.device(device):
          xs.append(tf.compat.v1.Variable(0, dtype=tf.int32, name=variable_name(device)))
          if spec.matmul_n:
            n = spec.matmul_n
            matrices.append(tf.compat.v1.Variable(
                tf.fill([n, n], micro.MATMUL_FILL), name=variable_name(device, "a")))
      self.init = tf.compat.v1.variables_initializer(xs + matrices)
      self.reads = [x.read_value() for x in xs]

      def computation(values):
        return _computation(tf, self.devices, matrices, values)

      values = [x.read_value() for x in xs]
      if spec.mode == "opbyop":
        values = computation(values)
        self.computations_per_call = 1
      elif spec.mode == "chained":
        for _ in range(spec.chain_length):
          values = computation(values)
        self.computations_per_call = spec.chain_length
      else:
        values = _loop(tf, computation, values, spec.chain_length)
        self.computations_per_call = spec.chain_length
      self.step = tf.group(*[x.assign(v) for x, v in zip(xs, values, strict=True)], name="step")


def _computation(tf, devices, matrices, values):
  """x <- sum(x) // num_devices + 1 on every device (+ [(A @ A)[0, 0] == n] first)."""
  if matrices:
    values = [_plus_matmul(tf, x, a, device)
              for x, a, device in zip(values, matrices, devices, strict=True)]
  with tf.device(devices[0]):
    total = tf.math.add_n(values)
  out = []
  for device in devices:
    with tf.device(device):
      out.append(total // len(devices) + 1)
  return out


def _plus_matmul(tf, x, a, device):
  with tf.device(device):
    with tf.control_dependencies([x]):  # a read per computation, after the previous one
      value = a.read_value()
    product = tf.linalg.matmul(value, value)
    # 1 for a full matmul of ones, 0 for a skipped or partial one. An equality, not
    # cast(corner / n): a graph divides by n as a multiply by 1/n, which for n like 41
    # or 249 gives 0.99999994 and casts to 0.
    n = tf.cast(tf.shape(value)[0], tf.float32)
    return x + tf.cast(tf.equal(product[0, 0], n), tf.int32)


def _loop(tf, computation, values, length):
  """chain_length computations in one TF1 while_loop (see the module docstring)."""
  was_v2 = tf.compat.v1.control_flow_v2_enabled()
  tf.compat.v1.disable_control_flow_v2()
  try:
    _, *final = tf.compat.v1.while_loop(
        lambda i, *xs: i < length,
        lambda i, *xs: [i + 1] + computation(list(xs)),
        [tf.constant(0)] + values)
  finally:
    if was_v2:
      tf.compat.v1.enable_control_flow_v2()
  return final


def _check_devices(session, devices) -> None:
  listed = {d.name for d in session.list_devices()}
  missing = [d for d in devices if d not in listed]
  if missing:
    raise RuntimeError(f"tf: the cluster lacks devices {missing}; it lists "
                       f"{sorted(listed)}")


def _measure(tf, session, program, spec, deadline) -> list:
  options = tf.compat.v1.RunOptions(timeout_in_ms=_remaining_ms(deadline, spec))
  session.run(program.init, options=options)
  step = session.make_callable(program.step, accept_options=True)
  calls = spec.calls_per_repeat
  done = 0
  seconds = []
  for repeat in range(spec.repeats + 1):  # repeat 0 is the untimed warmup
    start = time.perf_counter()
    for _ in range(calls):
      options.timeout_in_ms = _remaining_ms(deadline, spec)
      step(options=options)
    elapsed = time.perf_counter() - start
    done += calls * program.computations_per_call
    options.timeout_in_ms = _remaining_ms(deadline, spec)
    values = session.run(program.reads, options=options)
    for device, value in zip(program.devices, values, strict=True):
      micro.check(value, micro.expected(spec, done),
                  f"tf {spec.mode} repeat {repeat} on {device}")
    if repeat:
      seconds.append(elapsed)
  return seconds


def _explain(tf, error, cluster, spec, deadline):
  """A clearer exception for a TF error, or None to re-raise it as it is.

  A dead worker is named first: when worker 0 (the master) dies, the client's call
  only fails at the deadline, as a DeadlineExceededError.
  """
  exited = cluster.exited()
  if exited:
    return RuntimeError(f"tf: {cluster.describe(exited[0])}")
  if isinstance(error, tf.errors.DeadlineExceededError) or time.monotonic() >= deadline:
    return TimeoutError(f"tf: the run passed timeout_s={spec.timeout_s} "
                        f"({spec.mode}, hosts={spec.hosts})")
  return None


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def main() -> int:
  """run_private's child: for each micro.Spec, a JSON line on stdin, run() here and its
  seconds or its error as a JSON line on stdout; until stdin closes or SIGTERM."""
  results = os.fdopen(os.dup(1), "w")
  os.dup2(2, 1)  # whatever else is printed goes to stderr, not between the results
  signal.signal(signal.SIGTERM, _interrupt)  # how close() stops it: run() cleans up
  try:
    for line in sys.stdin:
      try:
        result = {"repeat_seconds": run(micro.Spec(**json.loads(line)))}
      except Exception as e:  # noqa: BLE001 - handed to run_private, which raises it
        traceback.print_exc()
        result = {"type": type(e).__name__, "error": str(e)}
      results.write(json.dumps(result) + "\n")
      results.flush()
  except KeyboardInterrupt:
    return 128 + signal.SIGINT
  return 0


if __name__ == "__main__":
  sys.exit(main())
