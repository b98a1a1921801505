"""Which other tf_tput train runs were live on this host while this one ran: two runs
measured on the same cores at once both measure too little, and their records must
say so (docs/records.md, `concurrent_runs`).

Each run's process 0 holds, while the run lives, a file in one directory of the host
(LIVE_DIR_ENV, else <tmp>/tf_tput-live-runs), named by its run id and pid, under an
fcntl lock: the lock, not the file, says the run is live, so a file left by a run that
was killed is stale and is removed by the next run that looks. A run that starts
lists the live ones and appends its id to each of their files; so each knows, at its
end, every run whose life overlapped its own: those it found, and those that wrote to
it. A directory of its own per Slurm job (a job_container plugin's private /tmp) hides
other jobs' runs; tf_tput says nothing then, Slurm's --exclusive keeps them apart.
"""

import errno
import fcntl
import os
import tempfile
from typing import Optional

LIVE_DIR_ENV = "TF_TPUT_LIVE_RUNS_DIR"


def _default_dir() -> str:
  return os.path.join(tempfile.gettempdir(), "tf_tput-live-runs")


def live_dir() -> str:
  return os.environ.get(LIVE_DIR_ENV) or _default_dir()


class LiveRun:
  """This run's place among the host's live runs, from register() to close()."""

  def __init__(self, run_id: str, directory: Optional[str] = None):
    self.run_id = run_id
    self.directory = directory or live_dir()
    self.path = os.path.join(self.directory, f"{run_id}.{os.getpid()}")
    self.found = set()  # run ids live when this run started
    self._fd = None

  def register(self) -> "LiveRun":
    """Joins the host's live runs; on any OS error (a read-only /tmp) this run says
    nothing of others rather than fail."""
    try:
      os.makedirs(self.directory, exist_ok=True)
      if (self.directory == _default_dir()
          and os.stat(self.directory).st_uid == os.geteuid()):
        os.chmod(self.directory, 0o1777)  # every user's runs meet here, as in /tmp
      # Locked before it has its name: an unlocked file under that name is stale.
      locking = os.path.join(self.directory, f".{os.path.basename(self.path)}")
      self._fd = os.open(locking, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
      os.fchmod(self._fd, 0o666)  # past the umask: another user's run writes its id here
      fcntl.flock(self._fd, fcntl.LOCK_EX)
      os.rename(locking, self.path)
      for other, path in self._live_others():
        self.found.add(other)
        _append(path, self.run_id)
    except OSError:
      self.close()
    return self

  def others(self) -> list:
    """Sorted run ids of the other runs live at some time since register()."""
    if self._fd is None:
      return []
    try:
      with open(self.path) as f:
        told = set(f.read().split())
    except OSError:
      told = set()
    return sorted((self.found | told) - {self.run_id})

  def __enter__(self) -> "LiveRun":
    return self

  def __exit__(self, *raised) -> bool:
    self.close()
    return False

  def close(self) -> None:
    if self._fd is not None:
      try:
        os.unlink(self.path)
      except OSError:
        pass
      os.close(self._fd)  # releases the lock
      self._fd = None

  def _live_others(self) -> list:
    """(run id, path) of every other run's file whose lock is held; stale ones removed."""
    live = []
    for name in os.listdir(self.directory):
      path = os.path.join(self.directory, name)
      run_id = name.split(".", 1)[0]
      if name.startswith(".") or path == self.path or run_id == self.run_id:
        continue
      if _held(path):
        live.append((run_id, path))
      else:
        try:
          os.unlink(path)
        except OSError:
          pass
    return live


def _held(path: str) -> bool:
  """Whether a live process holds the file's lock."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except OSError as e:
    return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
  finally:
    os.close(fd)


def _append(path: str, run_id: str) -> None:
  try:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
  except OSError:
    return  # it ended meanwhile, or its owner's directory is not ours to write
  try:
    os.write(fd, f"{run_id}\n".encode())  # one short write: whole under O_APPEND
  finally:
    os.close(fd)
