"""--system=pathways up to the connection (no Pathways cluster here): the environment
it is checked against before JAX starts, the bounded wait for the proxy, and its place
beside jax in table1_paper. The run itself against a silent proxy:
tests/e2e/test_pathways_cli.py."""

import importlib.util
import threading

import pytest

from tf_tput import config, suite as suites, systems
from tf_tput.errors import UsageError
from tf_tput.systems.jax import system as jax_system
from tf_tput.systems.jax.pathways import runtime as pathways_runtime

TARGET = "grpc://127.0.0.1:29000"


@pytest.mark.parametrize("environ, message", [
    ({}, "--system=pathways: JAX_BACKEND_TARGET is not set; point it at the Pathways "
         "cluster's IFRT proxy, e.g. JAX_BACKEND_TARGET=grpc://127.0.0.1:29000"),
    ({"JAX_BACKEND_TARGET": "127.0.0.1:29000"},
     "JAX_BACKEND_TARGET=127.0.0.1:29000 is not grpc://HOST:PORT"),
    ({"JAX_BACKEND_TARGET": "grpc://proxy"}, "JAX_BACKEND_TARGET=grpc://proxy is not"),
    ({"JAX_BACKEND_TARGET": TARGET, "JAX_PLATFORMS": "cpu"},
     "JAX_PLATFORMS=cpu: --system=pathways runs JAX on the Pathways proxy; set "
     "JAX_PLATFORMS=proxy or unset it"),
])
def test_the_proxy_address_comes_from_the_documented_environment(environ, message):
  with pytest.raises(UsageError) as raised:
    pathways_runtime.backend_target(environ)
  assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("environ", [
    {"JAX_BACKEND_TARGET": TARGET},
    {"JAX_BACKEND_TARGET": TARGET, "JAX_PLATFORMS": "proxy"},
    {"JAX_BACKEND_TARGET": "grpc://pathways-head-0.example.internal:29000"},
    {"JAX_BACKEND_TARGET": "grpc://[::1]:29000"},
])
def test_a_documented_environment_is_taken(environ):
  assert pathways_runtime.backend_target(environ) == environ["JAX_BACKEND_TARGET"]


def test_a_missing_package_names_the_extra_to_install(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "pathwaysutils" else real(name, *a))
  with pytest.raises(UsageError, match=r'--system=pathways needs pathwaysutils, not '
                     r'installed; install the extra: pip install -e "\.\[pathways\]"'):
    pathways_runtime.RUNTIME.check("local", False, 60.0)


class _FakeJax:
  """jax with a devices() that waits until released, fails at once, or answers."""

  def __init__(self, error=None, devices=None):
    self.released, self.error, self._devices = threading.Event(), error, devices

  def devices(self):
    if self.error:
      raise self.error
    if self._devices is None:
      self.released.wait(30)
    return self._devices


def test_a_proxy_that_never_answers_times_out_naming_it_the_variable_and_the_flag():
  jax = _FakeJax()
  with pytest.raises(TimeoutError) as raised:
    pathways_runtime.connect(jax, TARGET, 0.3)
  jax.released.set()
  assert str(raised.value).startswith(
      f"no Pathways proxy answered at {TARGET} (JAX_BACKEND_TARGET) within "
      "--cluster_timeout_s=0.3; start the Pathways cluster")


def test_a_proxy_client_that_gives_up_is_one_line_naming_the_address():
  error = RuntimeError("Unable to initialize backend 'proxy': INVALID_ARGUMENT:\n"
                       "Unable to establish connection")
  with pytest.raises(ConnectionError) as raised:
    pathways_runtime.connect(_FakeJax(error=error), TARGET, 5)
  assert str(raised.value).startswith(
      f"no Pathways proxy answered at {TARGET} (JAX_BACKEND_TARGET): Unable to initialize "
      "backend 'proxy': INVALID_ARGUMENT: Unable to establish connection; start")
  assert raised.value.__cause__ is error


def test_an_answering_proxy_gives_its_devices():
  assert pathways_runtime.connect(_FakeJax(devices=["TPU_0", "TPU_1"]), TARGET, 5) == [
      "TPU_0", "TPU_1"]


def test_virtual_cpu_devices_are_refused_before_jax_starts(monkeypatch):
  monkeypatch.setenv("JAX_BACKEND_TARGET", TARGET)
  with pytest.raises(UsageError, match="--num_cpu_devices=2: --system=pathways trains on "
                     "the Pathways cluster's devices"):
    pathways_runtime.RUNTIME.resolve(num_cpu_devices=2)
  with pytest.raises(UsageError, match="no worker servers"):
    pathways_runtime.RUNTIME.launch_workers()


def test_it_is_the_jax_adapter_as_a_single_controller():
  system = systems.load("pathways")
  assert isinstance(system, jax_system.JaxSystem)
  assert type(system).build is jax_system.JaxSystem.build  # the same trainers
  assert system.runtime is pathways_runtime.RUNTIME
  assert not system.multi_process and system.islands == () and system.strategies == (
      "local",)
  assert systems.distributions()["pathwaysutils"] == ("pathwaysutils",)
  # JAX's local compilation cache is not Pathways' (pathwaysutils turns it off).
  assert not system.runtime.keeps_compilation_cache
  with pytest.raises(UsageError, match="--strategy=tpu is not one --system=pathways runs"):
    systems.check_strategy("pathways", "tpu", config.load_experiment(["t5_tiny"]))


def test_table1_paper_sets_pathways_beside_every_jax_run():
  runs = suites.expand(suites.load("table1_paper"))
  by_system = {}
  for run in runs:
    by_system.setdefault(run.flags["system"], []).append(run)
  assert len(by_system["pathways"]) == len(by_system["jax"]) == 4
  for jax_run, pathways_run in zip(by_system["jax"], by_system["pathways"], strict=True):
    assert pathways_run.strategy == "local" and "num_cpu_devices" not in pathways_run.flags
    assert {k: v for k, v in pathways_run.flags.items() if k != "system"} == {
        k: v for k, v in jax_run.flags.items() if k != "system"}
    assert suites.validate(pathways_run) == suites.validate(jax_run)
