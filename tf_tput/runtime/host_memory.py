"""Freed host memory kept for reuse, so a training step does not fault in fresh pages.

glibc's malloc hands blocks above its mmap threshold (128 KiB, rising to 32 MiB as it
adapts) straight to the kernel and back on free, and trims the heap's top. A step's
temporaries (activations, gradients, XLA:CPU's per-run buffers) are freed and asked
for again every step, so each step faults in and zeroes fresh pages: on a 2-core
Sapphire Rapids VM, T5 Small spent 11-13% of jax's and torch's step time in the
kernel's page-fault path (docs/results/2026-12-05-cpu-step-profiles.md). PyTorch's
CPU performance guide recommends an allocator that keeps memory (jemalloc or
TCMalloc) for this reason. Telling glibc never to mmap, and to trim only past 2 GiB,
does the same without a preloaded library: freed blocks stay in the heap and the next
step reuses them (torch gained 1.28-1.33x; jax and tf2 nothing beyond noise). The
arithmetic is unchanged; a process's resident memory stays at its high point instead
of shrinking between steps.

Process-wide and before the frameworks allocate: train calls keep_freed_memory()
first (--keep_freed_memory), and records what it did (env.host_allocator).
"""

import ctypes
import ctypes.util
import platform

# mallopt() parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# The heap's top goes back to the kernel only beyond this much free memory there:
# mallopt takes an int, so 2 GiB is the most it can be told, far above a step's
# temporaries on the CPUs these runs fit.
TRIM_THRESHOLD_BYTES = 2 ** 31 - 1

_applied = None  # what keep_freed_memory() did in this process; None: not called


def _glibc():
  """glibc's C library, or None on another libc (musl, macOS)."""
  if platform.libc_ver()[0] != "glibc":
    return None
  return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_memory() -> str:
  """Makes glibc's malloc keep freed memory for reuse; what was done, which records'
  env.host_allocator then says (state())."""
  global _applied
  _applied = _keep()
  return _applied


def _keep() -> str:
  libc = _glibc()
  if libc is None:
    return f"{platform.libc_ver()[0] or 'not glibc'}: its default (not changed)"
  ok = (libc.mallopt(M_MMAP_MAX, 0) == 1
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
  version = platform.libc_ver()[1]
  if not ok:
    return f"glibc {version}: its default (mallopt refused the change)"
  return f"glibc {version}: freed memory kept (mallopt: mmap_max=0, trim_threshold=2 GiB)"


def kept() -> bool:
  """Whether this process keeps freed memory (so processes it starts can too)."""
  return bool(_applied) and "freed memory kept" in _applied


def state() -> str:
  """How this process's allocator runs: keep_freed_memory()'s account, else the
  libc's default."""
  if _applied is not None:
    return _applied
  name, version = platform.libc_ver()
  return f"{name} {version}: its default" if name else "not glibc: its default"
