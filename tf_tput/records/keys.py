"""Run keys: what a suite resumes by (docs/suites.md, "Resuming").

A key hashes everything that decides what a run measures: train: the system, the
strategy, num_cpu_devices, the gin bindings, and the name and CONTENT of every gin
file the run reads (with the files their `include` lines pull in); micro: the
configuration fields. Both include the code version, so editing a model file or the
code makes the same command measure again instead of keeping a stale record. Every
record stores its key (`run_key`); the suite planner computes the same function.
"""

import functools
import hashlib
import json
import re
import subprocess
from typing import Optional, Sequence

from tf_tput import REPO_ROOT, config
from tf_tput.records import provenance

# gin's include statement: include 'path' (or "path"), alone on its line.
_INCLUDE = re.compile(r"""^\s*include\s+(['"])(.+?)\1""", re.MULTILINE)


@functools.lru_cache(maxsize=None)
def code_version() -> Optional[str]:
  """The git commit this process runs; a dirty tree adds a hash of `git diff HEAD`
  (tracked files only), so each distinct diff is its own version. Once per process:
  it runs the code it imported at start. None outside a git checkout."""
  commit = provenance.git_commit()
  if commit is None or not commit.endswith("+dirty"):
    return commit
  try:
    diff = subprocess.run(["git", "-C", str(REPO_ROOT), "diff", "HEAD", "--no-ext-diff",
                           "--binary"], capture_output=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return commit  # dirty, diff unknown: still apart from the clean commit
  return f"{commit}.{hashlib.sha256(diff).hexdigest()[:12]}"


def gin_sources(gin_files: Sequence[str]) -> list:
  """[(name, sha256 of content)] of every gin file read, includes after their file,
  each resolved as config.resolve_gin_file resolves --gin_file."""
  out, seen = [], set()

  def visit(name: str) -> None:
    path = config.resolve_gin_file(name)
    text = path.read_bytes()
    out.append((name, hashlib.sha256(text).hexdigest()))
    if path in seen:  # gin would loop on a cycle; the key need not
      return
    seen.add(path)
    for match in _INCLUDE.finditer(text.decode("utf-8", "replace")):
      visit(match.group(2))

  for name in gin_files:
    visit(name)
  return out


def _hash(kind: str, values: dict) -> str:
  text = json.dumps([kind, values], sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_key(system: str, gin_files: Sequence[str], gin_params: Sequence[str],
            num_cpu_devices: Optional[int], strategy: str, commit: Optional[str],
            launch: Optional[dict] = None) -> str:
  """The key of a tf_tput.train run (gin_params: every binding it applies, in order).
  launch: how tf_tput.launch started it (launch_fields), None when it did not."""
  values = {"system": system, "gin_files": gin_sources(gin_files),
            "gin_params": list(gin_params), "num_cpu_devices": num_cpu_devices,
            "strategy": strategy, "code": commit}
  if launch:
    values["launch"] = launch
  return _hash("tf_tput.train", values)


def launch_fields(processes: int, islands: int = 0, dcn_rate: str = "none") -> Optional[dict]:
  """What of tf_tput.launch a run key holds: JAX processes and the islands (0: no
  --islands) with their link."""
  if processes == 1 and not islands:
    return None
  return {"processes": processes, "islands": islands,
          "dcn_rate": dcn_rate if islands > 1 else "none"}


def micro_run_key(system: str, mode: str, hosts: int, devices_per_host: int,
                  chain_length: int, computations: int, matmul_n: int,
                  commit: Optional[str]) -> str:
  """The key of a tf_tput.micro run. The repeat count is not in it: it says how often
  a configuration was timed."""
  return _hash("tf_tput.micro", {
      "system": system, "mode": mode, "hosts": hosts, "devices_per_host": devices_per_host,
      "chain_length": chain_length, "computations": computations, "matmul_n": matmul_n,
      "code": commit})
