"""The CPUs this process may run on, and whether its launcher narrowed them.

A launcher may bind each process to a few of the host's cores: Open MPI's mpirun binds
every rank to one core by default (2 ranks or fewer), srun does under --cpu-bind. A
run's virtual devices then compute on those cores only: t5_tiny on jax under
`mpirun -np 2` ran at 8,694 tokens/s bound, 19,798 with --bind-to none (2-core EPYC).
So records say which CPUs the recording process had (env.cpu_affinity) and the
launcher's binding (env.cpu_binding), the peak probe runs on the same CPUs and is
stored apart from an unbound one (measure/peak_store.py), and a narrowed run is said
in one line naming the fix (narrowing_note).
"""

import os
from typing import Optional


def allowed() -> tuple:
  """The CPUs this process may run on, sorted (every CPU where the OS cannot say)."""
  try:
    return tuple(sorted(os.sched_getaffinity(0)))
  except AttributeError:  # not Linux
    return tuple(range(os.cpu_count() or 1))


def host_count() -> int:
  return os.cpu_count() or 1


def as_list(cpus) -> str:
  """Linux's CPU list form: (0, 1, 2, 5) -> '0-2,5'."""
  ranges, cpus = [], sorted(cpus)
  for cpu in cpus:
    if ranges and cpu == ranges[-1][1] + 1:
      ranges[-1][1] = cpu
    else:
      ranges.append([cpu, cpu])
  return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def count(cpu_list: str) -> int:
  """How many CPUs a list of as_list's form names."""
  total = 0
  for part in filter(None, cpu_list.split(",")):
    first, _, last = part.partition("-")
    total += int(last or first) - int(first) + 1
  return total


# How to undo a launcher's binding, by launcher (runtime/launchers.py's names).
UNBIND = {"mpirun": "mpirun --bind-to none",
          "slurm": "srun --cpu-bind=none, or --cpus-per-task=N for N CPUs a task"}


def narrowing_note(cpu_affinity: str, cpu_count: int, launcher: Optional[str],
                   binding: Optional[str]) -> Optional[str]:
  """One line where the recording process could run on fewer CPUs than its host has,
  naming the fix; None where it had them all."""
  if count(cpu_affinity) >= cpu_count:
    return None
  if binding and binding != "none":
    by, fix = f"{launcher}'s binding: {binding}", UNBIND.get(launcher, "unbind it")
  else:  # not a launcher's doing: the job's or the container's CPUs, or taskset
    by = "CPUs it inherited: a job's or a container's cpuset, or taskset"
    fix = "run it where it may use them all (a whole node, no taskset)"
  return (f"CPUs narrowed: process 0 ran on CPU(s) {cpu_affinity}, {count(cpu_affinity)} "
          f"of the host's {cpu_count} ({by}); its devices and its peak probe had those "
          f"only; for the whole host: {fix}")
