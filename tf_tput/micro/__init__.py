"""Dispatch micro-benchmarks (Pathways Fig. 5 and 6): what a controller costs.

The computation, identical for every system: each device of every host holds one
int32 scalar x (all equal). One computation is an AllReduce-sum of x over all
devices followed by a scalar add: x <- sum(x) // num_devices + 1. Each computation's
output feeds the next, so after k computations from 0 every device holds k; the
systems check that value (expected()), and a fast wrong benchmark fails. With a
matmul size n (Fig. 6's crossover), each device first multiplies an n x n float32
matrix of ones by itself (held as an input, so no compiler can fold it away) and adds
1 to x when (A @ A)[0, 0] equals n, as it does exactly, before the AllReduce: every
computation then adds 2, and a skipped (zero) or partial matmul breaks the checked
value. An equality, not (A @ A)[0, 0] / n cast to an integer: compiled graphs divide
by multiplying with 1/n, which for some n (41, 249, ...) is 0.99999994, cast to 0.
The sizes come from one calibrated matmul rate per invocation
(tf_tput/micro/sizing.py).

Modes, as in the paper:
  opbyop   one client call per computation;
  chained  one client call runs a chain of chain_length dependent nodes, each node one
           computation;
  fused    one client call runs one node that loops chain_length computations.

A system module (tf_tput/micro/<system>.py) defines every one of these (MEMBERS;
tf_tput.micro calls them and never asks whether they exist):
  MODES: the modes it has (others are recorded as not applicable);
  unavailable() -> str | None: why it cannot run here (an extra not installed);
  run(spec) -> list[float]: wall seconds of each of spec.repeats timed repeats (after
      one untimed warmup repeat), each of spec.computations computations, all
      results checked. It starts its hosts as local processes on loopback and stops
      every one of them, on success, failure, timeout and Ctrl-C.
  run_private: run's form for servers that listen on every interface (tf's), run
      inside a private network namespace unless --expose_servers; None where its
      servers listen on loopback only;
  close(): stops whatever run() keeps from one run to the next (tf's client process,
      ray's cluster; nothing for jax); tf_tput.micro calls it once its runs are done.
"""

import dataclasses
import importlib

SYSTEMS = {"tf": "tf_tput.micro.tf_single", "jax": "tf_tput.micro.jax_multi",
           "ray": "tf_tput.micro.ray_actors"}
# The multi-controller system Fig. 6 measures the others against: a system's
# crossover is where its opbyop rate reaches this one's (crossover_result, and
# the report's crossover table).
REFERENCE = "jax"
MODES = ("opbyop", "chained", "fused")
MEMBERS = ("MODES", "unavailable", "run", "run_private", "close")  # of a system module


@dataclasses.dataclass(frozen=True)
class Spec:
  system: str
  mode: str
  hosts: int
  devices_per_host: int
  chain_length: int = 128
  computations: int = 1024     # per repeat; a multiple of chain_length
  repeats: int = 5
  matmul_n: int = 0            # 0: the scalar add alone; n: an n x n matmul too
  timeout_s: float = 300.0     # the whole run, hosts' start-up included

  @property
  def num_devices(self) -> int:
    return self.hosts * self.devices_per_host

  @property
  def calls_per_repeat(self) -> int:
    """Client calls per repeat: one per computation, or one per chain / loop."""
    return self.computations if self.mode == "opbyop" else (
        self.computations // self.chain_length)


MATMUL_FILL = 1.0  # every entry of the matmul's matrix: (A @ A)[0, 0] == n exactly


def expected(spec: Spec, computations: int) -> int:
  """Every device's x after `computations` computations from 0 (see the docstring)."""
  return computations * (2 if spec.matmul_n else 1)


class CheckError(RuntimeError):
  """A computation's result differs from the value the AllReduce must produce."""


def check(value, expected: int, where: str) -> None:
  if int(value) != expected:
    raise CheckError(f"{where}: got {value}, expected {expected}: the AllReduce or "
                     "the chain did not compute what it should")


def crossover_result(system: str, durations: list, records: dict, fraction: float,
                     sized) -> str:
  """Fig. 6's verdict for one system at one host count: the smallest duration whose
  opbyop rate reaches `fraction` of REFERENCE's; else how near it came. Either way,
  the durations where a run (the system's or REFERENCE's) gave no rate, naming its status.
  records: (system, ms) -> record; sized(ms): how a duration is written."""
  shares, missing = {}, []
  for ms in durations:
    pair = (records[(system, ms)], records[(REFERENCE, ms)])
    unmeasured = [f"{r['system']} {r['status']}" for r in pair if not r["computations_per_sec"]]
    if unmeasured:
      missing.append(f"{ms:g} ms ({', '.join(unmeasured)})")
    else:
      shares[ms] = pair[0]["computations_per_sec"] / pair[1]["computations_per_sec"]
  reached = [ms for ms, share in shares.items() if share >= fraction]
  if reached:
    verdict = sized(min(reached))
  elif shares:
    nearest = max(shares, key=shares.get)
    verdict = (f"not reached up to {sized(max(shares))}: at most {shares[nearest]:.0%} "
               f"of {REFERENCE}'s rate, at {nearest:g} ms")
  else:
    verdict = "not measured"
  return verdict + (f"; no rate at {', '.join(missing)}" if missing else "")


def system_module(name: str):
  return importlib.import_module(SYSTEMS[name])
