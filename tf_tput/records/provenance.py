"""Where a result came from: library versions, hardware, and the git commit."""

import hashlib
import importlib.metadata
import os
import pathlib
import platform
import re
import socket
import subprocess
import sys

from tf_tput import REPO_ROOT
from tf_tput.runtime import host_memory

# env key -> distributions its version is read from (None when not installed): what
# every run uses; each system adds what it is built from (System.distributions).
DISTRIBUTIONS = {"numpy": ("numpy",)}


def _version(names) -> str | None:
  for name in names:
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


# /proc/cpuinfo flags of x86 instructions that multiply bfloat16 natively (oneDNN uses
# them for TensorFlow's bfloat16 matmuls). Without one, a bfloat16 matmul is converted
# and computed slowly: on a 2-core AVX2-only EPYC, mtf's T5 Small bfloat16 step took
# ~10x its float32 step.
NATIVE_BFLOAT16_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags() -> set:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


def host_cache_subdirectory(framework_version: str, model: str, flags: set) -> str:
  """A compilation cache's subdirectory for one framework version on one kind of host
  CPU, e.g. "jax-0.10.2-AMD-EPYC-7B13-1a2b3c4d". Compiled CPU code is for the host's
  instruction sets, and a framework's own key may not tell hosts apart (XLA:CPU's
  platform version is just "cpu"; a VM's CPU model may hide its instruction sets), so
  a cache in a shared home directory keeps one subdirectory per CPU model and flag
  set; per framework version, so old entries can be deleted as a whole."""
  digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8]
  return re.sub(r"[^A-Za-z0-9.]+", "-", f"{framework_version}-{model}-{digest}").strip("-")


def native_bfloat16(flags=None) -> list:
  """The CPU's native bfloat16 matmul instructions (empty: none)."""
  flags = cpu_flags() if flags is None else flags
  return [flag for flag in NATIVE_BFLOAT16_FLAGS if flag in flags]


def this_node() -> str:
  """This process's node, as records name it: "<host name>/<its address>". The
  address tells apart the islands tf_tput.launch --islands makes on one machine
  (network namespaces where the host name resolves to the island's own 198.18.0.x,
  runtime/islands.py), as separate nodes, which they model; separate machines differ
  by host name. Where the name does not resolve, the host name alone."""
  host = socket.gethostname()
  try:
    return node_at(socket.gethostbyname(host))
  except OSError:
    return host


def node_at(address: str) -> str:
  """The node this machine is at `address` (an island's), as this_node() there names
  it."""
  return f"{socket.gethostname()}/{address}"


def versions(distributions: dict) -> dict:
  """env key -> the installed version of its distributions (None: not installed)."""
  return {key: _version(names) for key, names in distributions.items()}


def env(accelerators: list, distributions: dict) -> dict:
  """A record's env: versions of DISTRIBUTIONS and of `distributions` (every
  registered system's, tf_tput.systems.distributions()), and the hardware."""
  out = {"python": sys.version.split()[0]}
  out.update(versions({**distributions, **DISTRIBUTIONS}))
  out.update(platform=platform.platform(), cpu=cpu_model(), cpu_count=os.cpu_count(),
             cpu_bfloat16=native_bfloat16(), accelerators=accelerators,
             host_allocator=host_memory.state())
  return out


def git_commit() -> str | None:
  """HEAD of the checkout the package runs from, with "+dirty" when tracked files
  differ from it; None when installed (site-packages is no checkout of tf_tput, even
  inside some other repository's tree, as a .venv in a clone is)."""
  def git(*args):
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True,
                          text=True, timeout=10)
  try:
    top = git("rev-parse", "--show-toplevel")
    if top.returncode or pathlib.Path(top.stdout.strip()).resolve() != REPO_ROOT.resolve():
      return None
    head = git("rev-parse", "HEAD")
    if head.returncode:
      return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")
  except (OSError, subprocess.SubprocessError):
    return None
