"""Who started this process, and what are its rank, world size and coordinator?

The one place that reads cluster launchers' variables: train and the runtimes ask
detect() (through topology.launched()), never the environment. Recognised, the
innermost first (a launcher can run inside another: torchrun or mpirun in a Slurm
job, tf_tput.launch anywhere):

  launcher        its variables                       coordinator (process 0 serves it)
  tf_tput.launch  TF_TPUT_NUM_PROCESSES, _PROCESS_ID,  TF_TPUT_COORDINATOR
                  _COORDINATOR (runtime/processes.py)
  torchrun        RANK, WORLD_SIZE, LOCAL_RANK,        MASTER_ADDR:MASTER_PORT + 1 (torchrun's
                  MASTER_ADDR, MASTER_PORT             own store holds MASTER_PORT: `store`)
  mpirun          OMPI_COMM_WORLD_{RANK,SIZE,          mpirun's host (OMPI_MCA_orte_hnp_uri)
                  LOCAL_RANK}                          at JAX's port for the job
  tf_config       TF_CONFIG (Kubernetes, by hand)      its chief, else worker 0
  slurm           SLURM_JOB_ID; in a job step          the step's first node at JAX's port
                  SLURM_PROCID, SLURM_STEP_NUM_TASKS,  for the job
                  SLURM_LOCALID, SLURM_STEP_NODELIST

The processes of one run log one run id (run_id), the one process 0 records, where
their launcher gives one: tf_tput.launch and tf_tput.suite (processes.RUN_ID_ENV), and
a Slurm step (made of the step's ids, which all its tasks share). Under torchrun and
mpirun without it, each process makes its own, and process 0's is recorded.

The coordinators are where JAX's own cluster detection puts its own, so a framework
that brings its own rendezvous (torch's TCPStore) meets where JAX would. None of them
recognised: launcher None, one process, unless the framework finds a cluster itself
(JAX on a Cloud TPU pod or Kubernetes: systems/jax/runtime.py).

Variables that disagree stop the run before any framework starts (UsageError: one
line naming both values, exit 2).
"""

import dataclasses
import hashlib
import json
import os
import re
from typing import Mapping, Optional

from tf_tput.errors import UsageError
from tf_tput.records import build
from tf_tput.runtime import processes

# Launch.launcher of the processes tf_tput.launch starts (it starts a chief's worker
# servers itself, --num_workers, and the chief once).
TF_TPUT_LAUNCH = "tf_tput.launch"
LAUNCHERS = (TF_TPUT_LAUNCH, "torchrun", "mpirun", "tf_config", "slurm")

# The coordinator's port for a job, where JAX's own cluster detection puts its own
# (jax/_src/clusters/slurm_cluster.py, ompi_cluster.py) so the two agree: above Linux's
# ephemeral range, one per job id.
COORDINATOR_PORTS = (65535 - 2 ** 12 + 1, 2 ** 12)  # first port, how many


@dataclasses.dataclass(frozen=True)
class Launch:
  launcher: Optional[str] = None   # one of LAUNCHERS; None: started by hand, alone
  num_processes: int = 1
  process_id: int = 0
  local_process_id: int = 0
  local_num_processes: int = 1     # the processes of this launch on this host
  coordinator: Optional[str] = None  # host:port where process 0 serves a rendezvous
  store: Optional[str] = None      # host:port of a store the launcher serves (torchrun)
  job_id: Optional[str] = None     # the launcher's id of this job, where it has one
  # The step's hosts, in task order (Slurm: SLURM_STEP_NODELIST expanded); () unknown.
  hosts: tuple = ()
  tf_config: Optional[dict] = None  # TF_CONFIG's cluster and task, where it is set
  # The Slurm job array task the process runs in (SLURM_ARRAY_JOB_ID, _TASK_ID).
  array_job_id: Optional[str] = None
  array_task_id: Optional[int] = None
  # The run id all processes of this run share; None: none given, the run makes one.
  run_id: Optional[str] = None
  # How the launcher binds its processes to CPUs, as it says (runtime/cpus.py); None:
  # it does not, or does not say.
  cpu_binding: Optional[str] = None

  @property
  def alone(self) -> bool:
    return self.num_processes == 1


def _int(environ: Mapping, name: str) -> int:
  value = environ.get(name, "")
  try:
    return int(value)
  except ValueError:
    raise UsageError(f"{name}={value!r} is not a whole number; the launcher sets it, so "
                     "unset it or start the run from the launcher") from None


def _checked(launch: Launch, names: str) -> Launch:
  if launch.num_processes < 1 or not 0 <= launch.process_id < launch.num_processes:
    raise UsageError(f"{names} = {launch.process_id} of {launch.num_processes}: a process "
                     "index must be at least 0 and below the process count; unset them or "
                     "start the run from its launcher")
  return launch


def expand_hostlist(text: str) -> tuple:
  """Slurm's compressed host list ("node[01-03,07],login1") as host names, in order."""
  hosts = []
  for prefix, ranges, rest in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", text):
    if not ranges:
      hosts.append(prefix + rest)
      continue
    for part in ranges.split(","):
      first, _, last = part.partition("-")
      for n in range(int(first), int(last or first) + 1):
        hosts.append(f"{prefix}{n:0{len(first)}d}{rest}")
  return tuple(hosts)


def expand_counts(text: str) -> tuple:
  """Slurm's compressed task counts per node ("2(x3),1") as one count per node."""
  counts = []
  for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", text):
    counts += [int(count)] * int(repeat or 1)
  return tuple(counts)


def coordinator_port(job_id: int) -> int:
  first, count = COORDINATOR_PORTS
  return first + job_id % count


def _tf_tput_launch(environ) -> Optional[Launch]:
  if processes.NUM_PROCESSES_ENV not in environ:
    return None
  size = _int(environ, processes.NUM_PROCESSES_ENV)
  rank = _int(environ, processes.PROCESS_ID_ENV)  # all on this machine (or its islands)
  return _checked(Launch(TF_TPUT_LAUNCH, size, rank, rank, size,
                         environ.get(processes.COORDINATOR_ENV)),
                  f"{processes.PROCESS_ID_ENV} and {processes.NUM_PROCESSES_ENV}")


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _torchrun(environ) -> Optional[Launch]:
  given = [name for name in TORCHRUN_VARIABLES if name in environ]
  if not given:
    return None
  if len(given) < len(TORCHRUN_VARIABLES):
    missing = [name for name in TORCHRUN_VARIABLES if name not in environ]
    raise UsageError(f"{', '.join(f'{n}={environ[n]}' for n in given)} is set but not "
                     f"{', '.join(missing)}: torchrun sets all of them; start the run "
                     "with torchrun, or unset them")
  host, port = environ["MASTER_ADDR"], _int(environ, "MASTER_PORT")
  size = _int(environ, "WORLD_SIZE")
  return _checked(Launch("torchrun", size, _int(environ, "RANK"),
                         _int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0,
                         _int(environ, "LOCAL_WORLD_SIZE")
                         if "LOCAL_WORLD_SIZE" in environ else size,
                         coordinator=f"{host}:{port + 1}", store=f"{host}:{port}",
                         job_id=environ.get("TORCHELASTIC_RUN_ID")), "RANK and WORLD_SIZE")


ORTE_URI = "OMPI_MCA_orte_hnp_uri"


def _mpirun(environ) -> Optional[Launch]:
  if "OMPI_COMM_WORLD_SIZE" not in environ:
    return None
  size = _int(environ, "OMPI_COMM_WORLD_SIZE")
  uri = environ.get(ORTE_URI, "")
  # "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911" (Open MPI 4): the job, mpirun's host
  match = re.match(r"(\d+)\.\d+;tcp6?://\[?([^,\]:]+)", uri)
  if size > 1 and not match:
    raise UsageError(f"OMPI_COMM_WORLD_SIZE={size} but {ORTE_URI}={uri!r} names no "
                     "mpirun host: Open MPI 5 (PMIx) sets other variables; use Open MPI "
                     "4's mpirun, or srun")
  job = int(match.group(1)) // 2 ** 12 if match else 0  # JAX's reading of the job id
  return _checked(Launch("mpirun", size, _int(environ, "OMPI_COMM_WORLD_RANK"),
                         _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK"),
                         _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE")
                         if "OMPI_COMM_WORLD_LOCAL_SIZE" in environ else size,
                         coordinator=f"{match.group(2)}:{coordinator_port(job)}" if match else None,
                         job_id=match.group(1) if match else None,
                         # Unset: Open MPI 4's default, a core a rank for 2 ranks or
                         # fewer, a package each beyond.
                         cpu_binding=environ.get("OMPI_MCA_hwloc_base_binding_policy",
                                                 "Open MPI's default")),
                  "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE")


TF_CONFIG = "TF_CONFIG"


def _tf_config(environ) -> Optional[Launch]:
  """TF_CONFIG's task as a process of the job: a chief is process 0 and worker i
  process i + 1; without a chief worker i is process i (every worker runs the program).
  Its cluster is checked in full where it is used (systems/tensorflow/cluster.py)."""
  text = environ.get(TF_CONFIG)
  if not text:
    return None
  chiefs = workers = 0
  try:
    tf_config = json.loads(text)
    cluster, task = tf_config["cluster"], tf_config["task"]
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    index = int(task["index"]) + (chiefs if task["type"] == "worker" else 0)
  except (ValueError, KeyError, TypeError, AttributeError):
    index = -1
  if not 0 <= index < chiefs + workers:  # malformed: the TF runtime says how
    return Launch("tf_config", tf_config=None)
  return Launch("tf_config", chiefs + workers, index, tf_config=tf_config)


def _slurm(environ) -> Optional[Launch]:
  """A task of a Slurm job step (srun); in a batch script, which is no step, one
  process of the job."""
  if "SLURM_JOB_ID" not in environ:
    return None
  job_id = environ["SLURM_JOB_ID"]
  array = {"array_job_id": environ.get("SLURM_ARRAY_JOB_ID"),
           "array_task_id": (_int(environ, "SLURM_ARRAY_TASK_ID")
                             if "SLURM_ARRAY_TASK_ID" in environ else None)}
  if "SLURM_STEP_NUM_TASKS" not in environ:  # sbatch's script, salloc's shell
    return Launch("slurm", job_id=job_id, **array)
  size = _int(environ, "SLURM_STEP_NUM_TASKS")
  if "SLURM_NTASKS" in environ and _int(environ, "SLURM_NTASKS") != size:
    # JAX's own detection counts SLURM_NTASKS
    raise UsageError(f"SLURM_NTASKS={environ['SLURM_NTASKS']} but SLURM_STEP_NUM_TASKS="
                     f"{size}: this step's tasks are not the job's; run the step with "
                     "srun --ntasks equal to the job's --ntasks")
  hosts = expand_hostlist(environ.get("SLURM_STEP_NODELIST", ""))
  per_host = expand_counts(environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
  here = environ.get("SLURMD_NODENAME")
  return _checked(Launch("slurm", size, _int(environ, "SLURM_PROCID"),
                         _int(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ else 0,
                         (per_host[hosts.index(here)] if here in hosts
                          and len(per_host) == len(hosts) else size),
                         coordinator=(
                             f"{hosts[0]}:{coordinator_port(_int(environ, 'SLURM_JOB_ID'))}"
                             if hosts else None),
                         job_id=job_id, hosts=hosts, run_id=_slurm_run_id(environ),
                         cpu_binding=environ.get("SLURM_CPU_BIND"), **array),
                  "SLURM_PROCID and SLURM_STEP_NUM_TASKS")


def _slurm_run_id(environ) -> str:
  """The same in every task of one step, and new for each step, requeue and cluster."""
  step = ":".join(environ.get(name, "") for name in (
      "SLURM_CLUSTER_NAME", "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID"))
  return hashlib.sha256(step.encode()).hexdigest()[:build.RUN_ID_LENGTH]


def _given_run_id(environ) -> Optional[str]:
  run_id = environ.get(processes.RUN_ID_ENV)
  if run_id is not None and not re.fullmatch(f"[0-9a-f]{{{build.RUN_ID_LENGTH}}}", run_id):
    raise UsageError(f"{processes.RUN_ID_ENV}={run_id!r} is not a run id ("
                     f"{build.RUN_ID_LENGTH} hex digits); tf_tput.launch and tf_tput.suite set "
                     "it for the processes of one run: unset it")
  return run_id


@dataclasses.dataclass(frozen=True)
class SlurmAllocation:
  """What the Slurm job this process runs in may start as one job step (srun): tasks
  of cpus_per_task CPUs each on its CPUs, or, under sbatch --overcommit, any number."""
  cpus: int
  cpus_per_task: int
  overcommit: bool

  @property
  def max_step_tasks(self) -> Optional[int]:
    """None: no limit (--overcommit)."""
    return None if self.overcommit else self.cpus // self.cpus_per_task


def slurm_allocation(environ: Mapping = os.environ) -> Optional[SlurmAllocation]:
  """The allocation of the Slurm job this process runs in; None outside one."""
  if "SLURM_JOB_CPUS_PER_NODE" not in environ:
    return None
  return SlurmAllocation(sum(expand_counts(environ["SLURM_JOB_CPUS_PER_NODE"])),
                         _int(environ, "SLURM_CPUS_PER_TASK")
                         if "SLURM_CPUS_PER_TASK" in environ else 1,
                         environ.get("SLURM_OVERCOMMIT") == "1")


def _describe(launch: Launch) -> str:
  return f"{launch.launcher} (process {launch.process_id} of {launch.num_processes})"


def detect(environ: Mapping = os.environ) -> Launch:
  """This process's launch, innermost launcher first; UsageError where two launchers
  that cannot nest both claim it."""
  found = [launch for launch in (_tf_tput_launch(environ), _torchrun(environ),
                                 _mpirun(environ), _tf_config(environ), _slurm(environ))
           if launch is not None]
  if not found:
    return Launch(run_id=_given_run_id(environ))
  inner = found[0]
  for outer in found[1:]:
    # tf_tput.launch runs anywhere and sets TF_CONFIG itself (its tf2 workers);
    # torchrun and mpirun start their processes from Slurm tasks; an outer launcher
    # of one process (an sbatch script, a single srun task) started only the inner one.
    nests = (outer.alone or inner.launcher == TF_TPUT_LAUNCH
             or (inner.launcher in ("torchrun", "mpirun") and outer.launcher == "slurm"))
    if not nests:
      raise UsageError(f"two launchers claim this process: {_describe(inner)} and "
                       f"{_describe(outer)}; start it from one of them (unset the "
                       "other's variables)")
  slurm = next((launch for launch in found if launch.launcher == "slurm"), None)
  if slurm and inner is not slurm:  # the job and array task users look up
    inner = dataclasses.replace(inner, job_id=inner.job_id or slurm.job_id,
                                array_job_id=slurm.array_job_id,
                                array_task_id=slurm.array_task_id)
  given = _given_run_id(environ)
  return dataclasses.replace(inner, run_id=given) if given else inner
