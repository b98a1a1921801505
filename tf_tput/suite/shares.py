"""A suite split over a Slurm job array (docs/suites.md, "Job arrays").

`sbatch --array=0-N scripts/slurm/suite.sbatch ...` starts N + 1 copies of one suite,
all appending to one results file on a shared filesystem. Each task takes its share:
every (N + 1)-th run of the suite, in the suite's order, from its index in the array
(share()). Whatever the split, a task claims its runs before it starts them: a file
per run in a claims directory beside the results, holding the task's name
("<array job id>_<task id>", the same after a requeue). A run claimed by another task
that is still queued or running is refused in one line (two tasks would measure it
twice); a claim is released once its run has ended, and one left by a task that is
gone is taken over. A preempted and requeued task keeps its claims and resumes with
the runs that have no finished record yet.
"""

import dataclasses
import os
import shutil
import subprocess
from typing import Mapping, Optional

from tf_tput.errors import UsageError

SHARES = ("all", "slurm_array")
# squeue's states of a job that may still run its share.
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
               "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STOPPED",
               "SIGNALING", "STAGE_OUT")


@dataclasses.dataclass(frozen=True)
class ArrayTask:
  """SLURM_ARRAY_JOB_ID, _TASK_ID, _TASK_MIN, _TASK_MAX, _TASK_STEP, _TASK_COUNT."""
  job_id: str
  task_id: int
  low: int
  high: int
  step: int
  count: int

  @property
  def name(self) -> str:
    return f"{self.job_id}_{self.task_id}"  # as squeue and scontrol name it

  @property
  def index(self) -> int:
    """Its place among the array's tasks, 0 first; UsageError for an array whose tasks
    are not one evenly stepped range (1,3,7), which has no such place."""
    if (self.step < 1 or (self.high - self.low) // self.step + 1 != self.count
        or (self.task_id - self.low) % self.step):
      raise UsageError(f"array job {self.job_id}'s tasks ({self.count} of them, "
                       f"{self.low}-{self.high}) are not one range; submit the suite "
                       "with --array=0-N (or A-B:S)")
    return (self.task_id - self.low) // self.step


def array_task(environ: Mapping[str, str] = os.environ) -> Optional[ArrayTask]:
  """This process's Slurm array task; None outside an array job."""
  if "SLURM_ARRAY_TASK_ID" not in environ:
    return None
  try:
    return ArrayTask(environ["SLURM_ARRAY_JOB_ID"], int(environ["SLURM_ARRAY_TASK_ID"]),
                     int(environ["SLURM_ARRAY_TASK_MIN"]),
                     int(environ["SLURM_ARRAY_TASK_MAX"]),
                     int(environ.get("SLURM_ARRAY_TASK_STEP", "1")),
                     int(environ["SLURM_ARRAY_TASK_COUNT"]))
  except (KeyError, ValueError) as e:
    raise UsageError(f"this Slurm array task's variables are incomplete ({e}); submit "
                     "the suite with sbatch --array") from None


def share(runs: list, task: ArrayTask, suite_name: str) -> list:
  """The runs this array task takes: every task.count-th from its index."""
  if task.index >= len(runs):
    raise UsageError(f"array task {task.name} is task {task.index} of {task.count}, but "
                     f"suite {suite_name} has {len(runs)} run(s): no run is left for it; "
                     f"submit --array=0-{len(runs) - 1} or fewer tasks")
  return runs[task.index::task.count]


class Claims:
  """The claims directory of one results file; this task claims and releases runs."""

  def __init__(self, directory: str, task: ArrayTask):
    self.directory, self.task = directory, task

  def _path(self, run) -> str:
    return os.path.join(self.directory, run.key)

  def claim_all(self, runs: list) -> None:
    """Claims every run of `runs`, or none: UsageError naming the first that another
    live task holds."""
    os.makedirs(self.directory, exist_ok=True)
    taken = []
    for run in runs:
      owner = self._claim(run)
      if owner is not None:
        for mine in taken:
          self.release(mine)
        raise UsageError(
            f"run '{run.label}' is claimed by array task {owner} ({self._path(run)}), "
            f"and task {self.task.name} was given it too: two tasks would measure it "
            "twice; give each task its share (tf_tput.suite --share=slurm_array, as "
            "scripts/slurm/suite.sbatch does), or remove the file if that task is gone")
      taken.append(run)

  def _claim(self, run) -> Optional[str]:
    """None once this task holds the run's claim; else the live task that does."""
    path = self._path(run)
    try:
      fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # atomic on NFS 3+
    except FileExistsError:
      owner = _read(path)
      if owner in (self.task.name, None) or not _alive(owner):
        _write_atomically(path, self.task.name)  # ours after a requeue, or left behind
        return None
      return owner
    with os.fdopen(fd, "w") as f:
      f.write(self.task.name + "\n")
    return None

  def release(self, run) -> None:
    if _read(self._path(run)) == self.task.name:
      try:
        os.unlink(self._path(run))
      except FileNotFoundError:
        pass


def _read(path: str) -> Optional[str]:
  try:
    with open(path) as f:
      return f.read().strip() or None
  except FileNotFoundError:
    return None


def _write_atomically(path: str, text: str) -> None:
  with open(path + ".tmp", "w") as f:
    f.write(text + "\n")
  os.replace(path + ".tmp", path)


def _alive(task_name: str) -> bool:
  """Whether Slurm still runs or queues the array task; True where squeue cannot say."""
  if shutil.which("squeue") is None:
    return True
  try:
    proc = subprocess.run(["squeue", "-h", "-j", task_name, "-o", "%T"],
                          capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return True
  if proc.returncode:
    return "Invalid job id" not in proc.stderr
  return any(state in LIVE_STATES for state in proc.stdout.split())
