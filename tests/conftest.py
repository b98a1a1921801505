"""Shared by every test directory (pytest puts this directory on sys.path)."""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import process_checks
from tf_tput.runtime import host_runs


# Every train run a test starts (its subprocesses inherit this environment) keeps its
# compilation cache (--compilation_cache_dir's default) and its peak probes (the
# peak store) under XDG_CACHE_HOME: a directory of this test session, never the
# user's ~/.cache, removed at exit. One directory for the whole session: the pytest
# process that starts first makes it, and its xdist workers (started with its
# environment) use it, so a program compiled or a CPU probed in one worker is loaded
# in every other, as a user's second run loads it. (Both caches lock their writes.)
# Tests that need a cold cache name a directory of their own.
_SESSION_CACHE_ENV = "TF_TPUT_TEST_SESSION_CACHE"
if not os.environ.get(_SESSION_CACHE_ENV):
  os.environ[_SESSION_CACHE_ENV] = tempfile.mkdtemp(prefix="tf_tput-test-cache-")
  atexit.register(shutil.rmtree, os.environ[_SESSION_CACHE_ENV], True)
os.environ["XDG_CACHE_HOME"] = os.environ[_SESSION_CACHE_ENV]
# The live runs a record's concurrent_runs lists (tf_tput/runtime/host_runs.py) are
# this test process's alone: runs of the other xdist workers share the host, and
# would otherwise be listed in the records of tests that expect none.
os.environ[host_runs.LIVE_DIR_ENV] = tempfile.mkdtemp(
    prefix=f"live-runs-{os.getpid()}-", dir=os.environ[_SESSION_CACHE_ENV])


# One GEMM path per framework for the tests' runs (tf_tput/measure/gemm.py), set as a
# user sets it, so that no run probes every path in child processes: TF's two probes
# took ~26 s a dtype (once per session now that the workers share one peak store). Eigen, not oneDNN: on the tests' tiny models oneDNN's per-op setup made each
# mtf run slower (t5_tiny on 2x2, 10 steps: 25.6 s against 27.9 s). The tests of the
# choice itself remove these (test_gemm.py, test_train_cli.py, test_torch_cli.py).
GEMM_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_TPUT_TORCH_GEMM": "aten"}
for _name, _value in GEMM_ENV.items():
  os.environ.setdefault(_name, _value)


# Python writes bytecode as the tests' processes import modules, even where the shell
# sets PYTHONDONTWRITEBYTECODE (scripts/_venv.sh unsets it likewise for
# scripts/test.sh): with it set, `pytest tests -n 2 -m "not alone"` took 17 min 35 s
# against 12 min 19 s, each process compiling TF's, JAX's and torch's modules anew
# (2-core EPYC, 2026-12-07).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


# Tests of Ctrl-C send SIGINT to the entry points (and to pytest itself) and expect
# KeyboardInterrupt. A shell starts a background job (`cmd &`, nohup) with SIGINT
# ignored, children inherit that, and Python then installs no KeyboardInterrupt
# handler: those tests would test the launcher, not tf_tput. A Python handler here
# is reset to the default on exec, so every child gets Python's usual one again.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def no_leftover_processes(monkeypatch):
  """Marks this test's environment; fails the test if a process it started survives."""
  mark = process_checks.new_mark()
  monkeypatch.setenv(process_checks.MARK, mark)
  since = time.time() - 1.0  # create_time has the kernel's tick resolution
  yield mark
  left = process_checks.left_running(since, mark)
  assert not left, f"processes still running after the test: {left}"


# Tests whose processes bind loopback ports that another process picked (TF servers on
# the launcher's ports, a JAX coordinator, Ray's own): under scripts/test.sh's xdist
# workers they run in one worker, one after another, since a port found free and bound
# a moment later could be taken by a test in another. These files, and single tests
# marked `loopback_ports` (test_jax_cli.py, test_micro_cli.py). A test that only binds
# port 0 in its own process (busy_port), or whose launched children bind nothing
# (test_launch.py), or whose runs are one process each (test_suite_cli.py, one-host
# micro runs) cannot lose that race and runs anywhere.
LOOPBACK_PORT_FILES = {"test_tf2_workers.py", "test_tf_cluster.py", "test_micro_ray.py",
                       "test_micro_tf.py"}


# The TF micro-benchmarks time gRPC calls to local tf.distribute servers; once, with
# the other xdist worker loading the cores, a server aborted "The same RunGraph
# request was received twice" (a gRPC-level repeat of the call). scripts/test.sh runs
# them alone, after the parallel part: test_micro_tf.py's tests, and those of
# test_micro_cli.py that start TF servers (marked `alone` there). (The "half a sum"
# checks seen then were a real bug, now fixed: the matmul term cast corner / n =
# 0.99999994 to 0.)
ALONE_FILES = {"test_micro_tf.py"}


# Files whose module-scoped fixture trains models that every test in the file reads
# (one subprocess run for all cases). Under xdist each worker that gets one of their
# tests builds the fixture again (1-2 minutes each), so each file runs in one worker.
# test_jax_model.py and test_tf2_model.py each share their training runs across their
# tests the same way, through an lru_cache (the mtf reference runs both compare with
# are computed once per session, tests/mtf_references.py); test_ray_nodes.py its
# two-node Ray cluster.
SHARED_FIXTURE_FILES = {"test_jax_pipeline.py", "test_mtf_pipeline.py",
                        "test_jax_islands.py", "test_jax_model.py", "test_tf2_model.py",
                        "test_ray_nodes.py"}


# Files whose tests use the `slurm` fixture: one Slurm cluster per test session, so
# they run in one xdist worker.
SLURM_FILES = {"test_cluster_launchers.py", "test_slurm_fixture.py"}


@pytest.fixture(scope="session")
def slurm():
  """A real one-node Slurm cluster (and Open MPI's mpirun) in a private network
  namespace (tests/slurm_cluster.py), installed where missing and started once; on
  teardown nothing of it is left: no daemon, job, process in it, or namespace."""
  import slurm_cluster
  reason = slurm_cluster.missing() or slurm_cluster.install()
  if reason:
    pytest.skip(f"no Slurm cluster here: {reason}")
  cluster = slurm_cluster.SlurmCluster()
  cluster.start()
  try:
    yield cluster
  finally:
    daemons, namespace = list(cluster.daemons.values()), cluster.net.namespace
    inside = cluster.pids()  # the daemons, and the jobs' processes in the namespace
    cluster.stop()
    assert all(d.poll() is not None for d in daemons), "a Slurm daemon outlived stop()"
    left = slurm_cluster.alive(inside)
    assert not left, f"processes of the Slurm cluster outlived stop(): {left}"
    assert namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout, f"{namespace} left behind"


def pytest_ignore_collect(collection_path, config):
  """With `-m alone` alone (scripts/test.sh's second part), a test file with no test
  to run alone is not imported: importing them all (TF, JAX, torch) takes ~7 s, for
  tests that would be deselected. A file has such a test when conftest names it in
  ALONE_FILES or its source marks one (`pytest.mark.alone`, on a test or pytestmark)."""
  if (config.option.markexpr != "alone" or collection_path.suffix != ".py"
      or not collection_path.name.startswith("test_")):
    return None
  if (collection_path.name in ALONE_FILES
      or "mark.alone" in collection_path.read_text(encoding="utf-8")):
    return None
  return True


def pytest_configure(config):
  config.addinivalue_line("markers", "alone: run without other tests beside it "
                          "(scripts/test.sh runs these after the parallel part)")
  config.addinivalue_line("markers", "loopback_ports: binds loopback ports another "
                          "process picked; one xdist worker runs all such tests")
  report = os.environ.get(CPU_REPORT_ENV)
  if report:  # checked once here, not by every test's hook
    try:
      os.makedirs(report, exist_ok=True)
    except OSError as e:
      raise pytest.UsageError(f"{CPU_REPORT_ENV}={report} cannot be created "
                              f"({e.strerror}); name a writable directory") from None


# tryfirst: xdist's own hook turns xdist_group marks into the node-id suffix its
# loadgroup scheduler reads; marks added after it have no effect.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
  for item in items:
    if item.path.name in LOOPBACK_PORT_FILES or item.get_closest_marker("loopback_ports"):
      item.add_marker(pytest.mark.xdist_group("loopback_ports"))
    elif item.path.name in SLURM_FILES:
      item.add_marker(pytest.mark.xdist_group("slurm"))
    elif item.path.name in SHARED_FIXTURE_FILES:
      item.add_marker(pytest.mark.xdist_group(item.path.stem))
    if item.path.name in ALONE_FILES:
      item.add_marker(pytest.mark.alone)


# Where the suite's CPU time goes (docs/results/, issue 49): with TF_TPUT_TEST_CPU_REPORT
# set to a directory, each pytest process appends one JSON line per test there: its
# wall seconds and the CPU seconds of this process and of the children it (or they)
# waited for. Processes nobody here waits for (Slurm's, a Ray cluster's daemons) are
# not counted; the wall time still shows them.
CPU_REPORT_ENV = "TF_TPUT_TEST_CPU_REPORT"


def _cpu_seconds() -> float:
  import resource
  return sum(u.ru_utime + u.ru_stime for u in (
      resource.getrusage(resource.RUSAGE_SELF),
      resource.getrusage(resource.RUSAGE_CHILDREN)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  directory = os.environ.get(CPU_REPORT_ENV)
  if not directory:
    yield
    return
  import json
  cpu, wall = _cpu_seconds(), time.monotonic()
  yield
  line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
          "cpu_s": round(_cpu_seconds() - cpu, 3)}
  with open(os.path.join(directory, f"{os.getpid()}.jsonl"), "a") as f:
    f.write(json.dumps(line) + "\n")
