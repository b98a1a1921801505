"""tf_tput/measure/peak.py: the accelerator peak table and the CPU matmul probe."""

import math
import time

import pytest

from tf_tput.measure import peak as peak_lib


@pytest.mark.parametrize("kind,key", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA H200", "h200"),
    ("TPU v2", "tpu_v2"),
    ("TPU v3", "tpu_v3"),
    ("TPU v4", "tpu_v4"),
    ("TPU v5 lite", "tpu_v5e"),
    ("TPU v5e", "tpu_v5e"),
    ("TPU v5p", "tpu_v5p"),
    ("Tesla T4", None),
    ("Intel(R) Xeon(R) Platinum 8480+", None),
    ("", None),
])
def test_accelerator_key(kind, key):
  assert peak_lib.accelerator_key(kind) == key


def test_table_peak_known():
  assert peak_lib.table_peak("NVIDIA H100 80GB HBM3", "bfloat16") == (
      989.4e12, "table:h100:bfloat16")
  assert peak_lib.table_peak("NVIDIA H100 80GB HBM3", "float32") == (
      494.7e12, "table:h100:float32")
  assert peak_lib.table_peak("TPU v3", "bfloat16") == (61.5e12, "table:tpu_v3:bfloat16")
  assert peak_lib.table_peak("TPU v5 lite", "bfloat16") == (
      197e12, "table:tpu_v5e:bfloat16")


@pytest.mark.parametrize("kind,dtype", [
    ("Tesla T4", "float32"),
    ("AMD EPYC 7B13", "bfloat16"),
    ("TPU v3", "float32"),   # known device, no float32 entry: no guessed peak
])
def test_table_peak_unknown(kind, dtype):
  peak, source = peak_lib.table_peak(kind, dtype)
  assert peak is None
  assert source.startswith("none")
  assert kind in source and dtype in source


def test_measure_matmul_peak_with_fake_runner():
  calls = []
  def runner():  # a little real work, so no timed call can read as 0 s
    calls.append(sum(range(10_000)))
  rate = peak_lib.measure_matmul_peak(runner, n=64, repeats=3)
  assert len(calls) == 4   # one warm-up call, then the timed repeats
  assert rate > 0
  assert math.isfinite(rate)


def test_a_slow_matmul_is_timed_min_repeats_times_within_the_budget():
  calls = []
  def runner():
    calls.append(None)
    time.sleep(0.02)
  peak_lib.measure_matmul_peak(runner, n=64, repeats=10, budget_s=0.03, min_repeats=3)
  assert len(calls) == 1 + 3
  calls.clear()
  peak_lib.measure_matmul_peak(runner, n=64, repeats=5, budget_s=10.0)
  assert len(calls) == 1 + 5  # a fast one runs every repeat


def test_the_probe_checks_its_matmul_of_ones():
  peak_lib.check_matmul_corner(64.0, 64, "right")
  peak_lib.check_matmul_corner(2048.0 * (1 + 2 ** -8), 2048, "bfloat16 rounding")
  for wrong in (0.0, 32.0, 63.0, float("nan")):  # skipped, partial, off, broken
    with pytest.raises(RuntimeError, match="matmul of ones gave"):
      peak_lib.check_matmul_corner(wrong, 64, "wrong")


@pytest.mark.parametrize("runtime", ["jax", "tensorflow"])
def test_the_probe_runs_a_checked_matmul(runtime, monkeypatch):
  import importlib
  import types
  runtime = importlib.import_module(f"tf_tput.systems.{runtime}.runtime").RUNTIME
  topology = types.SimpleNamespace(session_target=None, devices=["/CPU:0"])
  runtime.matmul_runner(topology, 32, "float32")()   # ones: the check passes
  seen = []
  monkeypatch.setattr(peak_lib, "check_matmul_corner",
                      lambda corner, n, where: seen.append((float(corner), n)))
  runtime.matmul_runner(topology, 32, "float32")()
  assert seen == [(32.0, 32)]


def _probe_order(monkeypatch, topology, probes: bool) -> tuple:
  """(events in order, probe_alone's result) with the barrier and peak() recorded."""
  from jax.experimental import multihost_utils
  import importlib
  events = []
  monkeypatch.setattr(multihost_utils, "sync_global_devices", events.append)
  monkeypatch.setattr(peak_lib, "peak", lambda r, t, d, store: events.append(f"peak {d}")
                      or (7.0, "measured: fake"))
  folder = {"jax": "jax", "tf": "tensorflow"}[topology.framework]  # runtime name -> folder
  runtime = importlib.import_module(f"tf_tput.systems.{folder}.runtime").RUNTIME
  return events, peak_lib.probe_alone(runtime, topology, "float32", probes)


def test_launched_jax_processes_wait_around_the_probe(monkeypatch):
  from tf_tput.runtime.topology import Topology
  launched = Topology("jax", "cpu", ("a", "b", "c", "d"), "Test CPU", num_processes=2,
                      strategy="multi_process")
  events, result = _probe_order(monkeypatch, launched, probes=True)
  assert events == ["before the peak probe", "peak float32", "after the peak probe"]
  assert result == (7.0, "measured: fake")
  # The other processes meet the same two barriers and measure nothing.
  events, result = _probe_order(monkeypatch, launched, probes=False)
  assert events == ["before the peak probe", "after the peak probe"]
  assert result == (None, peak_lib.NOT_PROBED)


def test_one_process_and_tf_clusters_probe_without_a_barrier(monkeypatch):
  from tf_tput.runtime.topology import Topology
  for topology in (Topology("jax", "cpu", ("a",), "Test CPU"),
                   Topology("tf", "cpu", ("a", "b"), "Test CPU", num_processes=2,
                            strategy="multi_worker")):
    events, result = _probe_order(monkeypatch, topology, probes=True)
    assert events == ["peak float32"] and result == (7.0, "measured: fake")


def test_a_measured_peak_is_probed_again_and_the_higher_kept(monkeypatch):
  from tf_tput.runtime.topology import Topology
  one = Topology("jax", "cpu", ("a",), "Test CPU")
  again = []
  monkeypatch.setattr(peak_lib, "peak", lambda r, t, d: again.append(d) or
                      (200e9, "measured: after"))
  best, source = peak_lib.reprobed(None, one, "float32", (100e9, "measured: before"))
  assert (best, again) == (200e9, ["float32"])
  assert source.startswith("measured: after;") and "100 and 200 GFLOP/s" in source
  best, source = peak_lib.reprobed(None, one, "float32", (300e9, "measured: before"))
  assert best == 300e9 and source.startswith("measured: before;")
  # Table peaks, unprobed processes, launched processes and clusters keep the first.
  launched = Topology("jax", "cpu", ("a", "b"), "Test CPU", num_processes=2)
  cluster_of_one = Topology("tf", "cpu", ("a",), "Test CPU", session_target="grpc://w:1")
  for topology, first in ((one, (61.5e12, "table:tpu_v3:bfloat16")),
                          (one, (None, peak_lib.NOT_PROBED)),
                          (launched, (100e9, "measured: before")),
                          (cluster_of_one, (100e9, "measured: before"))):
    again.clear()
    assert peak_lib.reprobed(None, topology, "float32", first) == first and again == []


def test_a_failing_second_probe_keeps_the_first(monkeypatch):
  from tf_tput.runtime.topology import Topology
  def broken(runtime, topology, dtype):
    raise RuntimeError("the matmul of ones gave 0")
  monkeypatch.setattr(peak_lib, "peak", broken)
  first = (100e9, "measured: before")
  assert peak_lib.reprobed(None, Topology("jax", "cpu", ("a",), "Test CPU"), "float32",
                           first) == first


MEASURED = ("measured: jax 2048x2048 float32 matmul on the host CPU (2 cores) = 212 "
            "GFLOP/s, shared by 4 virtual device(s)")


def test_short_source_is_a_few_words():
  reprobed = (MEASURED + "; the higher of two probes, before and after the run (53 and "
              "48 GFLOP/s per device)")
  assert peak_lib.short_source(MEASURED) == "measured: jax matmul on the host CPU"
  assert peak_lib.short_source(reprobed) == "measured: jax matmul on the host CPU"
  worker = ("measured: tf 2048x2048 bfloat16 matmul on worker 0's CPU (127.0.0.1:2222) "
            "= 90 GFLOP/s, shared by 2 virtual device(s)")
  assert peak_lib.short_source(worker) == "measured: tf matmul on worker 0's CPU"
  assert peak_lib.short_source("table:h200:bfloat16") == "table:h200:bfloat16"
  assert peak_lib.short_source(peak_lib.NOT_PROBED) == peak_lib.NOT_PROBED
  assert peak_lib.short_source("measured: test") == "measured: test"
  none = peak_lib.table_peak("Tesla T4", "float32")[1]
  assert peak_lib.short_source(none) == "no peak table entry for 'Tesla T4' at float32"
  long = peak_lib.short_source("none: " + "x" * 200)
  assert len(long) == peak_lib.SHORT_SOURCE_LIMIT and long.endswith("…")


def test_source_kind_drops_what_was_measured():
  kind = ("measured: jax 2048x2048 float32 matmul on the host CPU (2 cores), shared by 4 "
          "virtual device(s)")
  assert peak_lib.source_kind(MEASURED) == kind
  assert peak_lib.source_kind(MEASURED.replace("212", "190") + "; the higher of two "
                              "probes, before and after the run (48 and 53 GFLOP/s per "
                              "device)") == kind
  assert peak_lib.source_kind("table:h200:bfloat16") == "table:h200:bfloat16"
  assert peak_lib.source_kind("measured: test") == "measured: test"


@pytest.mark.parametrize("flops,label", [(212e9, "212 GFLOP/s"), (53.04e9, "53 GFLOP/s"),
                                         (989.4e12, "989 TFLOP/s"),
                                         (999.9e9, "1 TFLOP/s"),
                                         (1.5e15, "1.5 PFLOP/s"), (12.5, "12.5 FLOP/s")])
def test_flops_label(flops, label):
  assert peak_lib.flops_label(flops) == label


# --------------------------------------------------------------------------------
# The peak store: one probe per CPU, framework version and dtype (peak_store.py)

class _CountingRuntime:
  """Runs a 'matmul' that takes a fixed time, counting the calls."""

  def __init__(self, seconds):
    self.calls, self.seconds = 0, seconds

  def matmul_runner(self, topology, n, dtype):
    def run():
      self.calls += 1
      time.sleep(self.seconds)
    return run


def _store(tmp_path, reprobe=False, versions=None):
  from tf_tput.measure import peak_store
  return peak_store.PeakStore(str(tmp_path / "peaks.json"), versions or {"jax": "0.10.2"},
                              reprobe=reprobe)


def test_a_stored_probe_is_used_instead_of_probing_again(tmp_path):
  from tf_tput.runtime.topology import Topology
  two = Topology("jax", "cpu", ("a", "b"), "Test CPU")
  runtime = _CountingRuntime(0.01)
  first, first_source = peak_lib.peak(runtime, two, "float32", _store(tmp_path))
  probed = runtime.calls
  assert probed >= 4 and peak_lib.STORED not in first_source  # a first call + repeats
  again, source = peak_lib.peak(runtime, two, "float32", _store(tmp_path))
  assert runtime.calls == probed and again == first  # nothing measured
  assert source.startswith(first_source + peak_lib.STORED)
  assert source.endswith(f"({tmp_path / 'peaks.json'})")
  assert peak_lib.source_kind(source) == peak_lib.source_kind(first_source)
  # Kept per whole CPU: one device gets what two shared.
  assert peak_lib.peak(runtime, Topology("jax", "cpu", ("a",), "Test CPU"), "float32",
                       _store(tmp_path))[0] == 2 * first
  # Stored probes are not probed again after the run.
  assert peak_lib.reprobed(runtime, two, "float32", (again, source)) == (again, source)
  assert runtime.calls == probed


@pytest.mark.parametrize("other", [
    dict(dtype="bfloat16"), dict(versions={"jax": "0.11.0"}), dict(reprobe=True)])
def test_another_dtype_version_or_reprobe_measures_again(tmp_path, other):
  from tf_tput.runtime.topology import Topology
  one = Topology("jax", "cpu", ("a",), "Test CPU")
  runtime = _CountingRuntime(0.01)
  peak_lib.peak(runtime, one, "float32", _store(tmp_path))
  probed = runtime.calls
  store = _store(tmp_path, other.get("reprobe", False), other.get("versions"))
  _, source = peak_lib.peak(runtime, one, other.get("dtype", "float32"), store)
  assert runtime.calls == 2 * probed and peak_lib.STORED not in source
  # What it measured is what the next run uses.
  _, source = peak_lib.peak(runtime, one, other.get("dtype", "float32"),
                            _store(tmp_path, False, other.get("versions")))
  assert runtime.calls == 2 * probed and peak_lib.STORED in source


def test_the_higher_probe_after_the_run_is_stored(tmp_path, monkeypatch):
  from tf_tput.runtime.topology import Topology
  two = Topology("jax", "cpu", ("a", "b"), "Test CPU")
  store = _store(tmp_path)
  monkeypatch.setattr(peak_lib, "peak", lambda r, t, d: (200e9, "measured: after"))
  peak_lib.reprobed(None, two, "float32", (100e9, "measured: before"), store)
  assert store.get("jax", "float32", peak_lib.MATMUL_PEAK_SIZE).flops == 400e9


def test_an_unreadable_or_foreign_store_is_probed_again(tmp_path):
  (tmp_path / "peaks.json").write_text("{not json")
  assert _store(tmp_path).get("jax", "float32", 2048) is None
  (tmp_path / "peaks.json").write_text('{"k": 1}')
  store = _store(tmp_path)
  store.put("jax", "float32", 2048, 1e11)  # kept beside what it does not know
  assert store.get("jax", "float32", 2048).flops == 1e11


def test_a_process_bound_to_fewer_cpus_probes_them_apart_and_its_devices_share_them(
    tmp_path, monkeypatch):
  """Under mpirun's default binding each rank has one core: its peak is that core's,
  stored apart from the whole host's, and shared by its own devices only."""
  from tf_tput.runtime import cpus
  from tf_tput.runtime.topology import Topology
  two_processes = Topology("jax", "cpu", ("a", "b"), "Test CPU", num_processes=2)
  runtime = _CountingRuntime(0.01)
  monkeypatch.setattr(cpus, "host_count", lambda: 2)
  monkeypatch.setattr(cpus, "allowed", lambda: (0, 1))
  whole, source = peak_lib.peak(runtime, two_processes, "float32", _store(tmp_path))
  assert "on the host CPU (2 cores)" in source and "shared by 2 virtual" in source
  probed = runtime.calls
  monkeypatch.setattr(cpus, "allowed", lambda: (1,))
  # taskset or a cpuset: every process has the same CPU, its devices all share it
  narrowed, source = peak_lib.peak(runtime, two_processes, "float32", _store(tmp_path))
  assert runtime.calls == 2 * probed  # not the unbound probe the store keeps
  assert "on CPU(s) 1 of the host's 2" in source and "shared by 2 virtual" in source
  from tf_tput.runtime import launchers, topology
  monkeypatch.setattr(topology, "launched", lambda: launchers.Launch(
      "mpirun", 2, cpu_binding="Open MPI's default"))  # a core for each rank
  bound, source = peak_lib.peak(runtime, two_processes, "float32", _store(tmp_path))
  assert "on CPU(s) 1 of the host's 2" in source and "shared by 1 virtual" in source
  assert bound == pytest.approx(2 * narrowed, rel=0.5)  # the same matmul, one device


def test_a_narrowed_affinity_is_one_line_naming_the_launcher_s_fix():
  from tf_tput.runtime import cpus
  assert (cpus.as_list((0, 1, 2, 5, 7, 8)), cpus.count("0-2,5,7-8")) == ("0-2,5,7-8", 6)
  assert cpus.narrowing_note("0-1", 2, "mpirun", "none") is None
  note = cpus.narrowing_note("1", 2, "mpirun", "Open MPI's default")
  assert note.startswith("CPUs narrowed: process 0 ran on CPU(s) 1, 1 of the host's 2 "
                         "(mpirun's binding: Open MPI's default)")
  assert note.endswith("for the whole host: mpirun --bind-to none")
  assert "--cpu-bind=none" in cpus.narrowing_note("0", 4, "slurm", "cores")
  inherited = cpus.narrowing_note("0", 4, None, None)
  assert "a job's or a container's cpuset, or taskset" in inherited
  assert "--bind-to" not in inherited and "--cpu-bind" not in inherited
  assert "a job's or a container's" in cpus.narrowing_note("0", 2, "mpirun", "none")


def test_systems_on_one_framework_keep_their_probes_under_its_versions():
  """mtf and tf2 run TF's matmul: one probe serves both (mtf's mesh_tensorflow is not
  part of its key); a system whose runtime declares none keys by its own."""
  from tf_tput import systems
  mtf, tf2, jax = (systems.probe_distributions(systems.load(name))
                   for name in ("mtf", "tf2", "jax"))
  from tf_tput.systems.tensorflow import runtime as tf_runtime
  assert mtf == tf2 == tf_runtime.RUNTIME.distributions
  assert jax == systems.load("jax").distributions
