"""tf_tput/measure/gemm.py: the fastest path's probe is chosen, kept per path beside
the peak, a failed probe recorded and never chosen, --gemm forces a path or is one
error line; the runtimes' paths (TF's oneDNN switch, torch's libraries) and torch's
library matmuls against torch's own, values and gradients. A train run's env.gemm:
tests/e2e/test_train_cli.py (TF's probes) and test_torch_cli.py (--gemm)."""

import os

import pytest

from tf_tput import gemm_probe, runtime as runtime_lib
from tf_tput.errors import UsageError
from tf_tput.measure import gemm, peak_store
from tf_tput.systems.tensorflow import runtime as tf_runtime


class FakeRuntime(runtime_lib.Runtime):
  name = "fake"

  def __init__(self, offered):
    self.offered = offered

  def gemm_paths(self, strategy, dtype):
    return self.offered


PATHS = {"slow": {"TF_TPUT_TEST_GEMM": "slow"}, "fast": {"TF_TPUT_TEST_GEMM": "fast"},
         "broken": {"TF_TPUT_TEST_GEMM": "broken"}}
FLOPS = {"slow": 100e9, "fast": 150e9}


class Probes(list):
  """A probe (choose's) answering from FLOPS ('broken' fails); the paths it was
  asked for, in order."""

  def __call__(self, environment, dtype):
    name = environment["TF_TPUT_TEST_GEMM"]
    self.append(name)
    if name not in FLOPS:
      raise RuntimeError("exit 1: no such library")
    return FLOPS[name]


@pytest.fixture
def probes(monkeypatch):
  monkeypatch.delenv("TF_TPUT_TEST_GEMM", raising=False)
  return Probes()


def _store(tmp_path, reprobe=False):
  return peak_store.PeakStore(str(tmp_path / "peaks.json"), {"fake": "1"}, reprobe)


def test_the_fastest_probe_is_chosen_and_each_path_kept(tmp_path, probes):
  chosen = gemm.choose(FakeRuntime(PATHS), "local", "float32", _store(tmp_path), probes)
  assert chosen["path"] == "fast" and chosen["chosen_by"] == "the fastest probe"
  assert chosen["probed_gflops"]["slow"] == 100.0
  assert chosen["probed_gflops"]["broken"].startswith("probe failed: exit 1")
  assert os.environ["TF_TPUT_TEST_GEMM"] == "fast"
  kept = _store(tmp_path).for_gemm("slow").get("fake", "float32", 2048)
  assert kept.flops == 100e9
  assert _store(tmp_path).get("fake", "float32", 2048) is None  # per path only
  # A second run reads the kept probes; only the failed one is probed again.
  del probes[:]
  again = gemm.choose(FakeRuntime(PATHS), "local", "float32", _store(tmp_path), probes)
  assert probes == ["broken"] and again["path"] == "fast"
  # --reprobe_peak probes every path again.
  del probes[:]
  gemm.choose(FakeRuntime(PATHS), "local", "float32", _store(tmp_path, True), probes)
  assert probes == list(PATHS)


def test_forced_only_and_no_paths(tmp_path, probes):
  forced = gemm.choose(FakeRuntime(PATHS), "local", "float32", _store(tmp_path), probes,
                       requested="slow")
  assert forced == {"path": "slow", "chosen_by": "--gemm", "probed_gflops": {}}
  assert os.environ["TF_TPUT_TEST_GEMM"] == "slow"
  only = gemm.choose(FakeRuntime({"fast": PATHS["fast"]}), "local", "float32",
                     _store(tmp_path), probes)
  assert only["chosen_by"] == "the only path offered"
  assert gemm.choose(FakeRuntime({}), "local", "float32", _store(tmp_path), probes) is None
  assert probes == []


class NamedOnlyRuntime(FakeRuntime):
  gemm_paths_named_only = ("fast", "absent")


def test_a_path_named_only_is_forced_never_probed(tmp_path, probes):
  runtime = NamedOnlyRuntime(PATHS)
  gemm.check(runtime, "local", "float32", "fast")  # --gemm may name it
  chosen = gemm.choose(runtime, "local", "float32", _store(tmp_path), probes)
  assert probes == ["slow", "broken"] and chosen["path"] == "slow"
  assert chosen["probed_gflops"]["fast"] == (
      "not probed: runs only where --gemm=fast or TF_TPUT_TEST_GEMM=fast names it")
  assert "absent" not in chosen["probed_gflops"]  # named only, but not offered
  forced = gemm.choose(runtime, "local", "float32", _store(tmp_path), probes, "fast")
  assert forced["path"] == "fast" and os.environ["TF_TPUT_TEST_GEMM"] == "fast"
  # One path left to auto is chosen unprobed; the one path offered is that one.
  del probes[:]
  two = {"slow": PATHS["slow"], "fast": PATHS["fast"]}
  chosen = gemm.choose(NamedOnlyRuntime(two), "local", "float32",
                       _store(tmp_path), probes)
  assert chosen["path"] == "slow" and chosen["chosen_by"] == "the only path auto chooses"
  only = gemm.choose(NamedOnlyRuntime({"fast": PATHS["fast"]}), "local",
                     "float32", _store(tmp_path), probes)
  assert only == {"path": "fast", "chosen_by": "the only path offered",
                  "probed_gflops": {}}
  every = gemm.choose(NamedOnlyRuntime({"fast": PATHS["fast"], "absent": {}}),
                      "local", "float32", _store(tmp_path), probes)
  assert every["path"] == "fast"
  assert every["chosen_by"] == "every path is named only: the first"
  assert probes == []


class PlainRuntime(runtime_lib.Runtime):
  name = "plain"


def test_a_runtime_that_declares_no_paths_offers_none(tmp_path, probes):
  assert gemm.choose(PlainRuntime(), "local", "float32", _store(tmp_path), probes) is None
  gemm.check(PlainRuntime(), "local", "float32", gemm.AUTO)
  assert probes == []


def test_every_probe_failing_runs_the_first_path(tmp_path, probes):
  offered = {"broken": PATHS["broken"], "also": {"TF_TPUT_TEST_GEMM": "also"}}
  chosen = gemm.choose(FakeRuntime(offered), "local", "float32", _store(tmp_path), probes)
  assert chosen["path"] == "broken"
  assert chosen["chosen_by"] == "every probe failed: the first path"


def test_a_child_probe_that_fails_is_an_error_with_its_last_words():
  """tf_tput/gemm_probe.py, train's probe: the child loads the system named."""
  with pytest.raises(RuntimeError, match=r"^exit 1: .*--system=nosuch is not a system"):
    gemm_probe.probe_in_child("nosuch", {}, "float32", n=8)


def test_an_unknown_path_is_one_error_line():
  with pytest.raises(UsageError, match=r"--gemm=blis: fake offers slow, fast, broken"):
    gemm.check(FakeRuntime(PATHS), "local", "float32", "blis")
  gemm.check(FakeRuntime({}), "local", "float32", gemm.AUTO)  # auto: always


class RefusingRuntime(FakeRuntime):
  def gemm_paths(self, strategy, dtype):
    raise UsageError("TF_TPUT_TEST_GEMM=blis: fake offers slow")


def test_a_path_the_environment_names_is_checked_before_the_run_even_for_auto():
  with pytest.raises(UsageError, match="TF_TPUT_TEST_GEMM=blis: fake offers slow"):
    gemm.check(RefusingRuntime({}), "local", "float32", gemm.AUTO)


def test_tf_paths_follow_its_onednn_switch(monkeypatch):
  runtime = tf_runtime.RUNTIME
  monkeypatch.delenv(tf_runtime.ONEDNN_ENV, raising=False)
  assert runtime.gemm_paths("local", "float32") == {
      "eigen": {tf_runtime.ONEDNN_ENV: "0"}, "onednn": {tf_runtime.ONEDNN_ENV: "1"}}
  assert runtime.gemm_paths("multi_worker", "float32") == {}  # the servers' own
  monkeypatch.setenv(tf_runtime.ONEDNN_ENV, "0")  # the user's choice stands
  assert runtime.gemm_paths("local", "float32") == {"eigen": {tf_runtime.ONEDNN_ENV: "0"}}


def test_torch_paths_are_its_libraries_or_the_one_the_environment_sets(monkeypatch):
  pytest.importorskip("torch")
  from tf_tput.systems.torch import gemm as torch_gemm
  from tf_tput.systems.torch import runtime as torch_runtime
  monkeypatch.delenv(torch_gemm.PATH_ENV, raising=False)
  offered = torch_runtime.RUNTIME.gemm_paths("local", "float32")
  assert offered == {name: {torch_gemm.PATH_ENV: name} for name in torch_gemm.offered()}
  assert "aten" in offered
  # zentorch runs where the user names it, never by the probe's choice.
  assert torch_runtime.RUNTIME.gemm_paths_named_only == ("zentorch",)
  for name in ("onednn", "zentorch"):  # the user's choice stands
    if name in torch_gemm.offered():
      monkeypatch.setenv(torch_gemm.PATH_ENV, name)
      assert torch_runtime.RUNTIME.gemm_paths("local", "float32") == {
          name: {torch_gemm.PATH_ENV: name}}
  monkeypatch.setenv(torch_gemm.PATH_ENV, "blis")  # one it lacks: before the run
  with pytest.raises(UsageError, match=r"TF_TPUT_TORCH_GEMM=blis: this torch offers "
                     r"aten.*; name one of those or unset it"):
    torch_runtime.RUNTIME.gemm_paths("local", "float32")


@pytest.mark.parametrize("name", ["onednn", "zentorch"])
def test_torch_library_matmul_matches_torch(name):
  torch = pytest.importorskip("torch")
  from tf_tput.systems.torch import gemm as torch_gemm
  if name not in torch_gemm.offered():
    pytest.skip(f"this torch has no {name} path")
  generator = torch.Generator().manual_seed(0)
  # A weight 128 wide: zentorch_mm left 8-wide weights alone, so a 16 x 8 one never
  # showed its weight cache writing into the weight.
  x = torch.randn(4, 64, 64, generator=generator, requires_grad=True)
  w = torch.randn(64, 128, generator=generator, requires_grad=True)
  try:
    torch_gemm.select("aten")
    expected = torch_gemm.matmul(x, w)
    expected_grads = torch.autograd.grad(expected.square().sum(), (x, w))
    assert torch_gemm.select(name) == name
    weight = w.detach().clone()
    got = torch_gemm.matmul(x, w.t().contiguous().t())  # a strided weight too
    grads = torch.autograd.grad(got.square().sum(), (x, w))
    again = torch_gemm.matmul(x, w)  # a call on w itself leaves it unchanged
    assert torch.equal(w, weight)  # zentorch's weight cache wrote into it
  finally:
    torch_gemm.select("aten")
  assert got.shape == (4, 64, 128)
  torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
  torch.testing.assert_close(again, expected, rtol=1e-5, atol=1e-4)
  for g, e in zip(grads, expected_grads, strict=True):
    torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def test_torch_refuses_a_path_it_lacks():
  pytest.importorskip("torch")
  from tf_tput.systems.torch import gemm as torch_gemm
  with pytest.raises(ValueError, match="TF_TPUT_TORCH_GEMM=blis: this torch offers aten"):
    torch_gemm.select("blis")
  assert torch_gemm.selected() == "aten"
