"""train --keep_freed_memory (tf_tput/runtime/host_memory.py): a block freed and asked
for again is reused without faulting in fresh pages, and records say which way a
process runs. Each case runs in its own process: the setting is process-wide."""

import json
import platform
import subprocess
import sys

import pytest

# Allocates, fills and frees a 64 MiB block (above glibc's largest mmap threshold)
# three times; prints the page faults of the last two and the allocator's state.
FAULTS = """
import ctypes, json, resource, sys
from tf_tput.runtime import host_memory
if sys.argv[1] == "keep":
  host_memory.keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def fill_and_free():
  block = libc.malloc(64 * 2 ** 20)
  ctypes.memset(block, 1, 64 * 2 ** 20)
  libc.free(block)
fill_and_free()  # the first one faults in any case
before = faults()
for _ in range(2):
  fill_and_free()
print(json.dumps({"faults": faults() - before, "state": host_memory.state(),
                  "kept": host_memory.kept()}))
"""


def _run(mode: str) -> dict:
  proc = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True,
                        text=True, timeout=60, check=True)
  return json.loads(proc.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_block_is_reused_without_page_faults_and_the_state_says_so():
  kept, default = _run("keep"), _run("default")
  # glibc gives each block back: at least one fault per 2 MiB (huge pages where the
  # kernel makes them; 4 KiB pages fault 512 times as often).
  assert default["faults"] >= 64, default
  assert kept["faults"] * 10 < default["faults"], (kept, default)  # reused in place
  assert kept["kept"] and "freed memory kept" in kept["state"]
  assert not default["kept"] and default["state"].endswith("its default")
