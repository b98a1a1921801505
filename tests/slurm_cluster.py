"""A real one-node Slurm cluster, and Open MPI's mpirun, for tests on this machine.

Launchers that run under srun, sbatch or mpirun meet those tools' environment,
signals and exit codes, which no stand-in reproduces, so their tests need the real
ones. SlurmCluster installs Debian's packages where they are missing (CI images lack
them), then starts munged, slurmctld and slurmd as its own children (foreground, so
it holds their pids and stops them by pid) from a configuration, munge key and state
of its own temporary directory: the machine's own Slurm and munge, if any, are never
read or touched. Every daemon, and every srun, sbatch and mpirun started through it,
runs inside a PrivateNetwork, so nothing it serves is reachable from other machines,
and the namespace's reaper kills whatever is left in it even if pytest dies.

    with SlurmCluster() as cluster:
      subprocess.run(cluster.srun_command(["-n", "2", "hostname"]), env=...)
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

import psutil

from tf_tput.runtime import namespaces

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "openmpi-bin"]
TOOLS = ["munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scontrol",
         "squeue", "scancel", "mpirun"]
# A new namespace has no other listener, so Slurm's usual ports are free in it.
CTLD_PORT, SLURMD_PORT = 6817, 6818
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}
# Open MPI's TCP transports skip loopback by default, and loopback is all the
# namespace has; one node needs nothing but shared memory between its ranks.
MPIRUN_OPTIONS = ["--oversubscribe", "--mca", "btl", "self,vader",
                  "--mca", "oob_tcp_if_include", "lo"]


def _absent() -> list:
  return [tool for tool in TOOLS if shutil.which(tool) is None]


def missing() -> Optional[str]:
  """Why a cluster cannot run here (root, ip, a way to get the packages), or None."""
  problem = namespaces.private_missing()
  if problem is None and _absent() and shutil.which("apt-get") is None:
    problem = f"{', '.join(_absent())} not installed and no apt-get to install them"
  return problem


def install(timeout: float = 900) -> Optional[str]:
  """apt-get installs PACKAGES where a tool is missing; why that failed, or None."""
  if not _absent():
    return None
  env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
  command = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
  try:
    proc = subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:  # stale or empty package lists
      subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=timeout)
      proc = subprocess.run(command, env=env, capture_output=True, text=True,
                            timeout=timeout)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"{' '.join(command)} failed: {e}"
  if proc.returncode or _absent():
    return (f"{' '.join(command)} failed (exit {proc.returncode}; still missing: "
            f"{', '.join(_absent())}): {proc.stderr.strip()[-300:]}")
  return None


def alive(pids: list) -> list:
  """'pid name' of those of `pids` still running (zombies are gone but unreaped)."""
  found = []
  for pid in pids:
    try:
      proc = psutil.Process(pid)
      if proc.status() != psutil.STATUS_ZOMBIE:
        found.append(f"{pid} {proc.name()}")
    except psutil.Error:
      pass
  return found


class SlurmCluster:
  """munged, slurmctld and slurmd of one node (this machine, `cpus` CPUs) in a
  private namespace; start() waits until the node is idle, stop() undoes it all."""

  def __init__(self):
    self.node = socket.gethostname().split(".")[0]  # slurmd's name for this host
    self.cpus = len(os.sched_getaffinity(0))
    # Not tf_tput's "tt<pid>" names, which tests count as their own leftovers.
    self.net = namespaces.PrivateNetwork(tag=f"slurm{os.getpid()}")
    self.dir = None
    self.daemons = {}   # name -> Popen

  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc):
    self.stop()

  def exec_prefix(self) -> list:
    """Into the namespace's network only: `ip netns exec` would also remount /sys,
    hiding the cgroup filesystem slurmd needs."""
    return ["nsenter", f"--net=/run/netns/{self.net.namespace}"]

  def env(self) -> dict:
    """To merge into a client's environment: where its slurm.conf is."""
    return {"SLURM_CONF": os.path.join(self.dir, "slurm.conf")}

  def start(self, timeout: float = 60) -> None:
    self.dir = tempfile.mkdtemp(prefix="slurm-cluster-")
    os.chmod(self.dir, 0o755)  # munged refuses a socket others cannot reach
    self.net.__enter__()
    try:
      self._start(timeout)
    except BaseException:
      self.stop()
      raise

  def _start(self, timeout: float) -> None:
    try:
      address = socket.gethostbyname(socket.gethostname())
    except OSError:
      address = "127.0.0.1"
    # Slurm resolves names with AI_ADDRCONFIG and AF_INET, for which glibc finds
    # nothing where 127.0.0.1 is the only IPv4 address: lo gets a second one, the
    # host name's own address where that is another (so that it exists inside too).
    extra = address if address != "127.0.0.1" else "127.0.0.2"
    self._run(["ip", "addr", "add", f"{extra}/32", "dev", "lo"])
    d = self.dir
    subprocess.run(["mungekey", "-c", "-b", "1024", "-k", f"{d}/munge.key"], check=True)
    os.makedirs(f"{d}/state")
    os.makedirs(f"{d}/spool")
    # slurmd loads a cgroup plugin even where no plugin of its uses cgroups: the
    # autodetected one fails without /sys/fs/cgroup (as under `ip netns exec`) and
    # v2's wants a systemd scope; v1 is only loaded, and touches nothing here.
    with open(f"{d}/cgroup.conf", "w") as conf:
      conf.write("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    with open(f"{d}/slurm.conf", "w") as conf:
      conf.write(f"""ClusterName=test
SlurmctldHost={self.node}({address})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
Waittime=0
SchedulerParameters=batch_sched_delay=0
NodeName={self.node} NodeAddr={address} CPUs={self.cpus} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
""")
    self._daemon("munged", ["munged", "-F", f"--socket={d}/munge.sock",
                            f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
                            f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"])
    self._wait(lambda: os.path.exists(f"{d}/munge.sock"), timeout, "munged's socket")
    self._daemon("slurmctld", ["slurmctld", "-D"])
    self._daemon("slurmd", ["slurmd", "-D", "-N", self.node])

    def idle():
      state = self._run(["sinfo", "-h", "-n", self.node, "-o", "%T"], check=False)
      return state.strip() == "idle"
    self._wait(idle, timeout, f"node {self.node} to be idle")

  def _daemon(self, name: str, command: list) -> None:
    with open(os.path.join(self.dir, f"{name}.out"), "w") as out:
      self.daemons[name] = subprocess.Popen(self.exec_prefix() + command, stdout=out,
                                            stderr=subprocess.STDOUT,
                                            env=self._env(), start_new_session=True)

  def _env(self) -> dict:
    env = {**os.environ, **self.env()}
    env.pop("TF_TPUT_TEST_PROCESS_MARK", None)  # the daemons are no one test's
    return env

  def _run(self, args: list, check: bool = True, timeout: float = 20) -> str:
    proc = subprocess.run(self.exec_prefix() + args, capture_output=True, text=True,
                          env=self._env(), timeout=timeout)
    if check and proc.returncode:
      raise RuntimeError(f"{' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout

  def _wait(self, ready, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
      dead = [n for n, p in self.daemons.items() if p.poll() is not None]
      if dead or time.monotonic() > deadline:
        logs = {n: self.log(n)[-800:] for n in self.daemons}
        raise RuntimeError(f"waiting for {what}: {'exited: ' + str(dead) if dead else 'timed out'}; "
                           f"logs: {logs}")
      time.sleep(0.1)

  def log(self, name: str) -> str:
    """What daemon `name` wrote (its own log file and its stdout)."""
    text = ""
    for suffix in (".log", ".out"):
      path = os.path.join(self.dir, name + suffix)
      if os.path.exists(path):
        text += open(path, errors="replace").read()
    return text

  def srun_command(self, args: list) -> list:
    """argv of `srun args` in the namespace; run it with env() merged in."""
    return self.exec_prefix() + ["srun", *args]

  def srun(self, args: list, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    kwargs = {"capture_output": True, "text": True, "env": self._env(), **kwargs}
    return subprocess.run(self.srun_command(args), timeout=timeout, **kwargs)

  def mpirun_command(self, np: int, args: list) -> list:
    """argv of `mpirun -np np args` on this node, in the namespace."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return self.exec_prefix() + ["mpirun", *root, *MPIRUN_OPTIONS, "-np", str(np), *args]

  def output_path(self, job_id: int) -> str:
    """Where sbatch() sends a job's output unless its args say otherwise."""
    return os.path.join(self.dir, f"job-{job_id}.out")

  def sbatch(self, script: str, args: list = (), script_args: list = (),
             cwd: Optional[str] = None) -> int:
    """Submits `script` with sbatch's `args` and its own `script_args`; the job id."""
    command = ["sbatch", "--parsable", f"--output={self.dir}/job-%j.out", *args, script,
               *script_args]
    proc = subprocess.run(self.exec_prefix() + command, capture_output=True, text=True,
                          env=self._env(), cwd=cwd, timeout=30)
    if proc.returncode:
      raise RuntimeError(f"sbatch failed: {proc.stderr.strip()[-500:]}")
    return int(proc.stdout.strip().split(";")[0])

  def job(self, job_id: int) -> dict:
    """`scontrol show job`'s fields (JobState, ExitCode, ...); {} once forgotten."""
    out = self._run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    return dict(f.split("=", 1) for f in out.split() if "=" in f)

  def wait_job(self, job_id: int, timeout: float = 60) -> tuple:
    """(exit code, state) once the job ended; the code is -N if signal N ended it."""
    deadline = time.monotonic() + timeout
    while (state := self.job(job_id).get("JobState")) not in ENDED:
      if time.monotonic() > deadline:
        raise TimeoutError(f"job {job_id} still {state} after {timeout} s")
      time.sleep(0.1)
    code, sig = (int(n) for n in self.job(job_id)["ExitCode"].split(":"))
    return (-sig if sig else code), state

  def requeue(self, job: str) -> None:
    """Stops a running job as a preemption does (SIGTERM, SIGKILL after KillWait) and
    queues it again, eligible at once."""
    self._run(["scontrol", "requeue", job])
    self._wait(lambda: self.job(job).get("JobState") == "PENDING", 30, f"{job} requeued")
    self._run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)

  def cancel(self, job) -> None:
    self._run(["scancel", str(job)], check=False)

  def jobs(self) -> list:
    """Ids of the jobs still pending, running or completing (an array's task as
    JOB_TASK)."""
    return self._run(["squeue", "-h", "-o", "%i"]).split()

  def pids(self) -> list:
    """The daemons' pids and every other process inside the namespace."""
    inside = subprocess.run(["ip", "netns", "pids", self.net.namespace],
                            capture_output=True, text=True).stdout.split()
    return sorted({p.pid for p in self.daemons.values()} | {int(p) for p in inside})

  def stop(self) -> None:
    """Cancels the jobs, stops the daemons by pid, removes the namespace and files."""
    try:
      ctld = self.daemons.get("slurmctld")
      if ctld is not None and ctld.poll() is None:
        try:
          left = self.jobs()
        except RuntimeError:
          left = []
        if left:
          self._run(["scancel", *map(str, left)], check=False)
          try:
            self._wait(lambda: not self.jobs(), 15, "cancelled jobs to end")
          except RuntimeError:
            pass  # the namespace's removal kills what is left of them
      for name in ("slurmd", "slurmctld", "munged"):
        proc = self.daemons.get(name)
        if proc is not None and proc.poll() is None:
          proc.send_signal(signal.SIGTERM)
          try:
            proc.wait(timeout=10)
          except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
      self.net.remove()
      if self.dir:
        shutil.rmtree(self.dir, ignore_errors=True)
