"""--system=ray's trainer: a driver (this process, the single controller) and one Ray
actor per device, each holding torch/trainer.py's TorchTrainer for its rows.

The actors are placed by one placement group, a bundle of one CPU (and one GPU on
GPUs) per actor, actor r in bundle r, under the strategy RayOptions.placement names
(system.py): SPREAD, Ray's best effort at one actor per node where the cluster has
enough nodes, by default; PACK to fill one node first. The group is removed on
close(), so nothing of the run's is left on a cluster it joined.

Every step the driver puts the global numpy batch into Ray's object store once and
calls step() on every actor with it; actor r trains rows [r*B/N, (r+1)*B/N) and the
actors all-reduce their gradients among themselves in one torch.distributed group
(gloo, NCCL on GPUs; rendezvous at actor 0: cluster.py), all on
loopback in a private cluster. An actor on another node pulls the batch from the
driver's node; across islands that and the all-reduce's ring are what cross the
links (link_bytes).
step() returns the global loss once every actor's result is in.

Failures: the driver waits in short polls, so a failure shows as soon as Ray reports
it: a dead actor (its process killed, say) is named with its rank, pid and node,
every actor is killed (a survivor may wait inside a collective for the dead one), and
the step raises; the loop records it. A node that dies takes its actors with it, but
Ray declares them dead only once its health checks give up on the node (about 15 s
by default), while their peers fail at once in the collective: the driver then
waits up to NODE_LOSS_S for Ray to name the dead node. Actors start within
--cluster_timeout_s (held in topology.handles). close() kills the actors, removes
their placement group and stops the run's cluster (leaves a joined one).
"""

import importlib
import logging
import os
import socket
import time
from typing import Optional

from tf_tput import data, errors
from tf_tput import systems

POLL_S = 1.0        # how often a waiting driver looks for failed actors (and Ctrl-C)
SETTLE_S = 2.0      # after one actor fails, how long the others get to report theirs
                    # (one blocked in a collective with a dead actor never does)
NODE_LOSS_S = 40.0  # then, with none reported dead, how long Ray gets to declare an
                    # actor's node dead (its health checks: 5 misses 3 s apart)
# What each actor holds: "module:class", called as (experiment, **options, device=,
# rank=, world_size=) with the group joined; tests pass a stand-in.
REPLICA = "tf_tput.systems.torch.trainer:TorchTrainer"


class TrainerActor:
  """One device: a TorchTrainer for its rows of every global batch."""

  def __init__(self, rank: int, world_size: int, device: str, threads: int,
               keep_freed_memory: bool = False):
    import torch
    from tf_tput.runtime import host_memory
    if keep_freed_memory:  # as the driver does (train --keep_freed_memory)
      host_memory.keep_freed_memory()
    torch.set_num_threads(threads)  # the actors share this node's cores
    self._rank, self._world_size, self._device = rank, world_size, device
    self._listener, self._trainer = None, None

  def pid(self) -> int:
    return os.getpid()

  def node(self) -> tuple:
    """(this node's name for records: host/address/Ray node id, the Ray node id)."""
    import ray
    node_id = ray.get_runtime_context().get_node_id()
    return f"{socket.gethostname()}/{ray.util.get_node_ip_address()}/{node_id}", node_id

  def listen(self, loopback: bool) -> tuple:
    """Actor 0: the group's rendezvous (host, port), already listening: on 127.0.0.1
    in a private cluster, else on this node's address (actors on other nodes)."""
    import ray
    from tf_tput.systems.torch.ray import cluster as ray_cluster
    host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
    self._listener = ray_cluster.listen_for_rendezvous(host)
    return host, self._listener.getsockname()[1]

  def join(self, host: str, port: int, timeout_s: float) -> None:
    from tf_tput.systems.torch.ray import cluster as ray_cluster
    ray_cluster.join_group(self._rank, self._world_size, port, timeout_s, self._listener,
                           backend="gloo" if self._device == "cpu" else "nccl", host=host)

  def build(self, experiment, replica: str, options: dict) -> int:
    module, _, name = replica.partition(":")
    self._trainer = getattr(importlib.import_module(module), name)(
        experiment, **options, device=self._device, rank=self._rank,
        world_size=self._world_size)
    return self._trainer.num_params

  def step(self, batch: dict) -> float:
    return self._trainer.step(batch)

  def device_memory_bytes(self) -> Optional[int]:
    return self._trainer.device_memory_bytes()

  def export_variables(self) -> dict:
    return self._trainer.export_variables()

  def load_variables(self, values: dict) -> None:
    self._trainer.load_variables(values)


class RayTrainer(systems.Trainer):
  """The driver: N actors, one per device of the topology."""

  def __init__(self, experiment, topology, replica: str = REPLICA,
               options: Optional[dict] = None):
    import ray
    from tf_tput.systems.torch.ray import cluster as ray_cluster
    from tf_tput.runtime import cpus, host_memory
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    self._ray = ray
    self._cluster = topology.handles["cluster"]
    self._actors, self._pids, self._group = [], [], None
    self._nodes, self._node_ids = [], []  # each actor's, in rank order
    options = dict(options or {})
    placement = options.pop("placement", "SPREAD")
    count = topology.num_devices
    gpu = topology.platform == "gpu"
    timeout_s = topology.handles["timeout_s"]
    deadline = ray_cluster.Deadline.after(
        timeout_s, where=f"the Ray cluster at {self._cluster.address}",
        flag="--cluster_timeout_s")
    # The actors share this host's cores evenly, as launched torch processes do. In a
    # joined cluster that is the driver's host's count, which assumes nodes like it.
    threads = max(1, len(cpus.allowed()) // count) if not gpu else 1
    bundle = {"CPU": 1, **({"GPU": 1} if gpu else {})}
    actor = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0, max_restarts=0)(TrainerActor)
    try:
      self._group = ray.util.placement_group([bundle] * count, strategy=placement)
      ray_cluster.get(ray, self._group.ready(), deadline,
                      f"placing {count} actor(s) of {bundle} ({placement})")
      self._actors = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
          self._group, placement_group_bundle_index=rank)).remote(
              rank, count, "cuda" if gpu else "cpu", threads, host_memory.kept())
                      for rank in range(count)]
      self._pids = ray_cluster.get(ray, [a.pid.remote() for a in self._actors], deadline,
                                   f"starting {count} actor(s)")
      where = ray_cluster.get(ray, [a.node.remote() for a in self._actors], deadline,
                              "naming the actors' nodes")
      self._nodes, self._node_ids = [w[0] for w in where], [w[1] for w in where]
      self.nodes = tuple(sorted(set(self._nodes)))  # the record's (train.py)
      self._cluster.track()
      for rank, pid in enumerate(self._pids):
        logging.info("ray actor %d: pid %d on node %s", rank, pid, self._nodes[rank])
      host, port = ray_cluster.get(
          ray, self._actors[0].listen.remote(self._cluster.private), deadline,
          "actor 0's rendezvous listener")
      join_s = max(1.0, deadline.left())
      self._gather([a.join.remote(host, port, join_s) for a in self._actors],
                   f"joining the actors' process group (rendezvous at "
                   f"tcp://{host}:{port})")
      built = [a.build.remote(experiment, replica, options) for a in self._actors]
      self.num_params = self._gather(built, "building the torch trainers")[0]
      if topology.islands > 1:  # one Ray node per island (tf_tput.launch)
        self.analytic_link_bytes_per_step = link_bytes(
            experiment, self._node_ids, ray.get_runtime_context().get_node_id())
    except BaseException:
      self.close()
      raise

  def step(self, batch: dict) -> float:
    ref = self._ray.put(batch)  # one copy in the object store, read by every actor
    losses = self._gather([a.step.remote(ref) for a in self._actors], "a step")
    return float(losses[0])  # every actor returns the global loss

  def device_memory_bytes(self) -> Optional[int]:
    per_actor = self._gather([a.device_memory_bytes.remote() for a in self._actors],
                             "reading device memory")
    return None if None in per_actor or not per_actor else max(per_actor)

  def export_variables(self) -> dict:
    return self._gather([self._actors[0].export_variables.remote()],
                        "exporting the variables")[0]

  def load_variables(self, values: dict) -> None:
    ref = self._ray.put(values)
    self._gather([a.load_variables.remote(ref) for a in self._actors],
                 "loading the variables")

  def close(self) -> None:
    """Kills the actors and stops the run's cluster (with every process it started)."""
    try:
      for a in self._actors:
        self._ray.kill(a, no_restart=True)
      if self._group is not None:
        self._ray.util.remove_placement_group(self._group)
    except Exception:  # noqa: BLE001 - the cluster may be gone already; stop() follows
      logging.warning("killing the ray actors failed", exc_info=True)
    finally:
      self._actors, self._group = [], None
      self._cluster.stop()

  def _gather(self, refs, what: str) -> list:
    """Every actor's result, in rank order; on the first failure the failing actors
    named (a dead one first), every actor killed, and RuntimeError raised."""
    ray = self._ray
    while True:
      ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
      if len(ready) == len(refs):
        try:
          return ray.get(refs)
        except ray.exceptions.RayError:
          break
      if any(self._failure(ref) for ref in ready):
        break
    ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)  # the others' errors too
    failures = [(rank, self._failure(ref)) for rank, ref in enumerate(refs)]
    failures = [(rank, e) for rank, e in failures if e is not None]
    dead = [(rank, e) for rank, e in failures
            if isinstance(e, ray.exceptions.RayActorError)]
    # An actor Ray cannot reach, or one that never answers (none having died), may be
    # on a lost node, which Ray declares dead only later: worth waiting for where
    # that node is not the driver's own (a private cluster's only node).
    done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
    silent = [rank for rank, e in dead if isinstance(e, ray.exceptions.ActorUnavailableError)]
    silent += [rank for rank, ref in enumerate(refs) if ref not in done and not dead]
    here = ray.get_runtime_context().get_node_id()
    lost = self._lost_nodes(wait=any(self._node_ids[rank] != here for rank in silent
                                     if rank < len(self._node_ids)))
    text = "; ".join([f"Ray node {name} died" for name in lost] + [
        f"ray actor {rank} ({self._actor(rank)}) {_fate(e)}: {_short(e)}"
        for rank, e in (dead or failures)])
    self.close()
    raise RuntimeError(f"{what}: {text}; every actor stopped")

  def _actor(self, rank: int) -> str:
    """pid and node of actor `rank`, as far as known."""
    pid = self._pids[rank] if rank < len(self._pids) else "?"
    return f"pid {pid}" + (f", node {self._nodes[rank]}" if rank < len(self._nodes) else "")

  def _lost_nodes(self, wait: bool) -> list:
    """The names of the actors' nodes that Ray reports dead; with `wait`, polled for
    up to NODE_LOSS_S until one is (Ray's health checks are slower than gloo)."""
    deadline = time.monotonic() + (NODE_LOSS_S if wait and self._node_ids else 0)
    while True:
      try:
        dead = {n["NodeID"] for n in self._ray.nodes() if not n["Alive"]}
      except Exception:  # noqa: BLE001 - the cluster's GCS itself may be gone
        return []
      lost = sorted({name for name, node_id in zip(self._nodes, self._node_ids, strict=True)
                     if node_id in dead})
      if lost or time.monotonic() >= deadline:
        return lost
      time.sleep(POLL_S)

  def _failure(self, ref):
    """The error a ready ref holds, or None (not ready, or a value)."""
    ray = self._ray
    try:
      ray.get(ref, timeout=0)
    except ray.exceptions.GetTimeoutError:
      return None
    except ray.exceptions.RayError as e:
      return e
    return None


def link_bytes(experiment, actor_nodes: list, driver_node: str) -> int:
  """Bytes a step sends between islands, one Ray node per island, actor r on node
  actor_nodes[r] (where the placement group put it): the actors' all-reduce ring
  (torch/trainer.py), and the global batch, pulled once by each node that holds an
  actor but is not the driver's."""
  from tf_tput.systems.torch import trainer as torch_trainer
  lengths = data.lengths_of(experiment)
  batch = experiment.train.global_batch * data.TOKEN_BYTES * sum(
      lengths[k] for k in data.features_of(experiment))
  return (torch_trainer.all_reduce_link_bytes(experiment, actor_nodes)
          + batch * len(set(actor_nodes) - {driver_node}))


def _fate(error) -> str:
  """What became of the actor an error is about, in a word or two."""
  import ray
  if isinstance(error, ray.exceptions.ActorUnavailableError):
    return "became unreachable"
  return "died" if isinstance(error, ray.exceptions.RayActorError) else "failed"


def _short(error) -> str:
  """A Ray error in one line: the actor's own exception (a task's error) or the first
  line of Ray's account of a death, without the remote traceback the log has."""
  import ray
  cause = getattr(error, "cause", None)
  if isinstance(cause, BaseException) and not isinstance(
      error, ray.exceptions.RayActorError):
    return errors.one_line(cause, 300)
  first = next((line for line in str(error).splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {' '.join(first.split())}"[:300]
