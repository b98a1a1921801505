r"""Starts a local cluster on loopback, runs a command in it, and stops every process.

Processes (N copies of the command; systems with multi_process, e.g. jax):

    python -m tf_tput.launch --num_processes=2 -- \
        python -m tf_tput.train --system=jax --num_cpu_devices=2 ...

Each process gets TF_TPUT_COORDINATOR (127.0.0.1 and a free port), TF_TPUT_NUM_PROCESSES
and TF_TPUT_PROCESS_ID (runtime/processes.py); the system's runtime joins them.

Worker servers (N of them, for systems whose runtime serves workers): the System
named by the command's --system says how they run (its every_worker). One that
drives them (mtf) is the command, their chief:

    python -m tf_tput.launch --num_workers=2 --devices_per_worker=2 -- \
        python -m tf_tput.train --system=mtf --strategy=multi_worker ...

The workers listen on free loopback ports (or --port onwards) and must serve within
--start_timeout_s. Where every worker runs the program (tf2), the launcher starts N
copies of the command, each worker i of a loopback cluster; worker 0 appends the
record:

    python -m tf_tput.launch --num_workers=2 --devices_per_worker=2 -- \
        python -m tf_tput.train --system=tf2 --strategy=multi_worker ...

Processes across islands (tf_tput.runtime.islands: network namespaces joined by
links shaped to --dcn_rate; needs root and iproute2):

    python -m tf_tput.launch --islands=2 --dcn_rate=1gbit --num_processes=4 -- \
        python -m tf_tput.train --system=jax --num_cpu_devices=2 ...

The processes split into the islands in order; the launcher removes the namespaces it
made however it ends. Worker servers across islands split the same way, each task on
its island's address, the chief (the command) in island 0:

    python -m tf_tput.launch --islands=2 --dcn_rate=1gbit --num_workers=2 \
        --devices_per_worker=4 -- \
        python -m tf_tput.train --system=mtf --strategy=multi_worker ...

Ray nodes are --system=ray's worker servers: `ray start` starts each, the head in
island 0 (or all on loopback), and the command is their driver, joining them through
RAY_ADDRESS; its actors are spread over the nodes (systems/torch/ray/nodes.py):

    python -m tf_tput.launch --islands=2 --dcn_rate=1gbit -- \
        python -m tf_tput.train --system=ray --num_cpu_devices=2 ...

With --islands=K and no count, a system with worker servers gets K of them, one per
island.

Worker servers may listen on every interface whatever address they are given (TF's
and Ray's do), so they and every process that talks to them (the command) start inside a
private network namespace with nothing but loopback (runtime.namespaces.PrivateNetwork;
needs root and iproute2), removed however the launch ends. Where none can be made the
launcher refuses in one line, unless --expose_servers accepts servers reachable from
other machines. Islands are namespaces of their own already.

When any process fails, the launcher names it, stops the others (SIGTERM, then SIGKILL
after --grace_s) and exits non-zero; Ctrl-C stops them all the same way.
"""

import contextlib
import dataclasses
import sys
from typing import Optional

from absl import flags

from tf_tput import entry, systems
from tf_tput.errors import UsageError
from tf_tput.runtime import islands, namespaces, processes

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_processes", None, "Processes to start, each running the "
                     "command (systems that run as processes).")
flags.DEFINE_integer("num_workers", None, "Worker servers to start for the command's "
                     "--system (docs/clusters.md says what each system's are); the "
                     "command drives them as the cluster's chief, or runs on every "
                     "worker where its system says so. Unset with --islands=K: K, where "
                     "the system has worker servers.")
flags.DEFINE_integer("devices_per_worker", 1, "Logical CPU devices per worker server "
                     "(the CPUs it offers).")
flags.DEFINE_integer("port", 0, "Workers: first of num_workers + 1 consecutive loopback "
                     "ports (chief, then workers); 0 picks free ports.")
flags.DEFINE_float("start_timeout_s", 60.0, "Workers: seconds they get to start serving.")
flags.DEFINE_float("grace_s", 5.0, "Seconds between SIGTERM and SIGKILL when stopping.")
flags.DEFINE_float("timeout_s", None, "Stop everything and fail after this many seconds.")
flags.DEFINE_integer("islands", None, "Split the processes (or the worker servers, "
                     "their chief in island 0) into this many islands, "
                     "network namespaces on 198.18.0.0/15 joined by links shaped to "
                     "--dcn_rate (needs root and iproute2); 1: one island on loopback "
                     "with the same island axis (the baseline). Unset: no island axis.")
flags.DEFINE_string("dcn_rate", islands.NO_LIMIT, "With --islands: the rate each "
                    "island's link sends at, as tc writes it (1gbit, 200mbit), or "
                    f"{islands.NO_LIMIT}.")
flags.DEFINE_bool("expose_servers", False, "Workers: start the worker servers and the "
                  "command in this machine's own network, where servers that listen on "
                  "every interface can be reached, unauthenticated, from any machine "
                  "that reaches this one. Unset: inside a private network namespace "
                  "with nothing but loopback (needs root and iproute2); with --islands=K "
                  "> 1 they are in the islands' namespaces either way.")


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  num_processes: Optional[int]
  num_workers: Optional[int]
  devices_per_worker: int
  port: int
  start_timeout_s: float
  grace_s: float
  timeout_s: Optional[float]
  islands: Optional[int]
  dcn_rate: str
  expose_servers: bool


def _usage(message: str) -> int:
  print(f"error: {message}", file=sys.stderr)
  return 2


def _workers(request: LaunchRequest, command) -> int:
  """Worker servers of the command's system, and the command as their chief or on
  each of them."""
  system = systems.load(systems.named_in(command))
  if not system.runtime.serves_workers:
    return _usage(f"--num_workers starts worker servers, which --system={system.name} "
                  "has none of; launch it with --num_processes=N")
  for name, value in (("num_workers", request.num_workers),
                      ("devices_per_worker", request.devices_per_worker)):
    if value < 1:
      return _usage(f"--{name}={value}; it must be >= 1")
  if not request.start_timeout_s > 0:
    return _usage(f"--start_timeout_s={request.start_timeout_s}; it must be > 0")
  if request.islands is not None:
    return _workers_in_islands(request, system, command)
  ports = None
  if request.port:
    ports = list(range(request.port, request.port + request.num_workers + 1))
    if ports[-1] > 65535:
      return _usage(f"--port={request.port} leaves no room for {len(ports)} ports; choose "
                    "a lower one")
    busy = processes.busy_ports(ports)
    if busy:
      return _usage(f"--port={request.port}: port(s) {', '.join(map(str, busy))} of "
                    f"{ports[0]}-{ports[-1]} are in use; choose another --port or leave it "
                    "unset for free ports")
  return _in_servers_network(
      request.expose_servers, lambda network: system.runtime.launch_workers(
          command, system.every_worker, request.num_workers, request.devices_per_worker,
          request.grace_s, request.timeout_s, request.start_timeout_s, ports,
          network=network))


def _exposure_refusal(problem: str) -> str:
  """The error line when no private network namespace can be made (`problem`)."""
  return ("worker servers may listen on every interface, so they start inside a "
          f"private network namespace with only loopback, but {problem}; run as root "
          "with iproute2, or pass --expose_servers to start them in this machine's "
          "network, reachable (unauthenticated) from other machines")


def _in_servers_network(expose_servers: bool, launch):
  """launch(network) with network a private namespace (runtime.namespaces.PrivateNetwork)
  that every process of the cluster starts in; with --expose_servers, launch(None).
  Refused (UsageError) before anything starts where no namespace can be made."""
  if expose_servers:
    return launch(None)
  with contextlib.ExitStack() as stack:
    try:
      network = stack.enter_context(namespaces.PrivateNetwork())
    except (UsageError, RuntimeError) as e:  # not root, no ip, or `ip netns` refused
      raise UsageError(_exposure_refusal(str(e))) from None
    return launch(network)


def run(request: LaunchRequest, command: list) -> int:
  if not command:
    return _usage("no command to launch; put it after --, e.g. python -m tf_tput.launch "
                  "--num_processes=2 -- python -m tf_tput.train ...")
  if request.dcn_rate != islands.NO_LIMIT and request.islands is None:
    return _usage(f"--dcn_rate={request.dcn_rate} shapes the links between islands; add "
                  "--islands=K")
  try:
    named = systems.named_in(command, default=None)  # a train command's --system
    if (request.num_processes is None and request.num_workers is None and request.islands
        and named and systems.load(named).runtime.serves_workers):
      # One worker server (a Ray node) per island.
      request = dataclasses.replace(request, num_workers=request.islands)
    if (request.num_processes is None) == (request.num_workers is None):
      return _usage("give exactly one of --num_processes=N (processes, each running "
                    "the command) or --num_workers=N (worker servers for the command's "
                    "system)")
    if request.num_workers is not None:
      return _workers(request, command)
    if request.num_processes < 1:
      return _usage(f"--num_processes={request.num_processes}; it must be >= 1")
    if request.islands is None:
      return processes.launch(command, request.num_processes, request.grace_s,
                              request.timeout_s)
    return _in_islands(request, command)
  except processes.StartError as e:
    return _usage(f"{e}; check the command after --")
  except UsageError as e:
    return _usage(str(e))


# One island on loopback (the baseline) still has the island axis and reduction.
ONE_ISLAND_ENV = {islands.NUM_ISLANDS_ENV: "1", islands.ISLAND_ENV: "0"}


def _island_rate(request: LaunchRequest, count_flag: str, count: int):
  """--dcn_rate in bits/s (None: unshaped), checked against --islands."""
  rate = islands.parse_rate(request.dcn_rate)
  if request.islands < 1 or count % request.islands:
    raise UsageError(f"--islands={request.islands} with --{count_flag}={count}: give "
                     f"islands that divide the {count_flag.split('_')[1]} evenly")
  if request.islands == 1 and rate is not None:
    raise UsageError(f"--dcn_rate={request.dcn_rate} with --islands=1: one island has no "
                     "link between islands; drop --dcn_rate")
  return rate


def _in_islands(request: LaunchRequest, command) -> int:
  rate = _island_rate(request, "num_processes", request.num_processes)
  if request.islands == 1:
    return processes.launch(command, request.num_processes, request.grace_s,
                            request.timeout_s, env_of=lambda i: ONE_ISLAND_ENV)
  with islands.IslandNetwork(request.islands, rate) as network:
    return processes.launch(command, request.num_processes, request.grace_s,
                            request.timeout_s, network=network)


def _workers_in_islands(request: LaunchRequest, system, command) -> int:
  """The workers split into the islands, their chief (the command) in island 0."""
  if system.every_worker or "data" not in system.islands:
    able = [name for name in systems.able("islands") if systems.load(name).runtime
            .serves_workers and not systems.load(name).every_worker]
    raise UsageError(f"--islands with --num_workers: --system={system.name} does not "
                     "train across islands as worker servers; use --system="
                     f"{' or --system='.join(able)}, or --num_processes for a system "
                     "that runs as processes")
  rate = _island_rate(request, "num_workers", request.num_workers)
  if request.port:
    raise UsageError(f"--port={request.port} with --islands: inside islands every task "
                     "has its own port; drop --port")
  args = (command, system.every_worker, request.num_workers, request.devices_per_worker,
          request.grace_s, request.timeout_s, request.start_timeout_s)
  if request.islands == 1:  # loopback: inside a private namespace, as without --islands
    return _in_servers_network(
        request.expose_servers, lambda network: system.runtime.launch_workers(
            *args, network=network, chief_env=ONE_ISLAND_ENV))
  with islands.IslandNetwork(request.islands, rate) as network:
    return system.runtime.launch_workers(*args, network=network)


def main(argv) -> int:
  request = LaunchRequest(
      num_processes=FLAGS.num_processes, num_workers=FLAGS.num_workers,
      devices_per_worker=FLAGS.devices_per_worker, port=FLAGS.port,
      start_timeout_s=FLAGS.start_timeout_s, grace_s=FLAGS.grace_s,
      timeout_s=FLAGS.timeout_s, islands=FLAGS.islands, dcn_rate=FLAGS.dcn_rate,
      expose_servers=FLAGS.expose_servers)
  return run(request, command=argv[1:])


if __name__ == "__main__":
  entry.start(main)
