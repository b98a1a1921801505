"""The registry and what shared code asks of a System (tf_tput/systems/__init__.py)."""

import json
import os
import subprocess
import sys

import pytest

from tf_tput import PACKAGE_DIR, config, runtime as runtime_lib, systems
from tf_tput.errors import UsageError
from tf_tput.runtime import namespaces

# Without root, worker servers can only run in this machine's network (docs/clusters.md).
EXPOSE = [] if namespaces.private_missing() is None else ["--expose_servers"]


@pytest.mark.parametrize("command, name", [
    (["python", "-m", "tf_tput.train", "--system=tf2"], "tf2"),
    (["python", "-m", "tf_tput.train", "--system", "tf2", "--steps=2"], "tf2"),
    (["python", "-m", "tf_tput.train", "-system=jax"], "jax"),
    (["python", "-m", "tf_tput.train", "--steps=2"], systems.DEFAULT),
])
def test_the_launcher_reads_the_system_in_every_form_absl_takes(command, name):
  assert systems.named_in(command) == name


def test_every_registered_system_has_the_interface():
  protocol = set(systems.System.__annotations__) | {"check", "build"}
  for name in systems.REGISTRY:
    system = systems.load(name)
    # Subclasses, so that every optional member has its declared default.
    assert systems.System in type(system).__mro__, f"{name} does not subclass System"
    assert runtime_lib.Runtime in type(system.runtime).__mro__, (
        f"{name}'s runtime does not subclass tf_tput.runtime.Runtime")
    missing = [a for a in sorted(protocol) if not hasattr(system, a)]
    assert not missing, f"{name} lacks {missing}"
    assert system.name == name
    assert set(system.strategies) <= {"local", "multi_worker", "tpu"}
    assert set(system.traces) <= set(system.strategies)


def test_only_a_chief_of_worker_servers_drives_them():
  """Ray's runtime serves workers too (tf_tput.launch starts its nodes), but its
  driver is no chief: only mtf's runtime's workers serve (serve_worker)."""
  assert [name for name in systems.BUILT_IN
          if systems.drives_worker_servers(systems.load(name))] == ["mtf"]


def test_records_carry_every_systems_library_versions():
  keys = systems.distributions()
  for name in systems.REGISTRY:
    assert set(systems.load(name).distributions) <= set(keys)


def test_strategy_checks_are_the_systems_own():
  tiny = config.load_experiment(["t5_tiny"])
  model_parallel = config.load_experiment(["t5_tiny", "data2_model2"])
  with pytest.raises(UsageError, match="--strategy=tpu is not one --system=jax runs"):
    systems.check_strategy("jax", "tpu", tiny)
  with pytest.raises(UsageError, match="data parallel only"):  # tf2's own check
    systems.check_strategy("tf2", "local", model_parallel)
  systems.check_strategy("mtf", "local", model_parallel)


def test_scanned_layers_are_refused_by_systems_that_do_not_scan():
  scanned = config.load_experiment(["t5_tiny"], ["ModelConfig.scan_layers = True"])
  systems.check_strategy("jax", "local", scanned)
  able = [name for name in systems.REGISTRY if systems.load(name).scans_layers]
  assert able[:2] == ["jax", "pathways"] and systems.able("scans_layers") == able
  for name in ("mtf", "tf2", "torch", "ray"):
    with pytest.raises(UsageError, match=rf"^ModelConfig.scan_layers = True: --system="
                       rf"{name} runs the layers one by one; drop the binding, or use "
                       r"--system=jax or --system=pathways"):
      systems.check_strategy(name, "local", scanned)
    systems.check_strategy(name, "local", config.load_experiment(["t5_tiny"]))
  # parity may set a scanned system beside unscanned ones: same arithmetic
  systems.check_experiment("mtf", scanned)


def test_variant_names_non_default_options_and_scanned_layers():
  plain = config.load_experiment(["t5_tiny"], [], systems.options("torch"))
  assert systems.variant("torch", plain) is None
  compiled = config.load_experiment(["t5_tiny"], ["TorchOptions.compile = True"],
                                    systems.options("torch"))
  assert systems.variant("torch", compiled) == "TorchOptions.compile=True"
  assert "TorchOptions.compile = True" in compiled.operative_config  # recorded config
  plain = config.load_experiment(["t5_tiny"], [], systems.options("ray"))
  assert systems.variant("ray", plain) is None  # SPREAD: the default placement
  packed = config.load_experiment(["t5_tiny"], ["RayOptions.placement = 'PACK'"],
                                  systems.options("ray"))
  assert systems.variant("ray", packed) == "RayOptions.placement='PACK'"
  scanned = config.load_experiment(["t5_tiny"], ["ModelConfig.scan_layers = True"])
  assert systems.variant("jax", scanned) == "ModelConfig.scan_layers=True"
  assert systems.caveat("jax") is None and "never run" in systems.caveat("pathways")


def test_a_plugin_never_replaces_a_built_in_system(tmp_path):
  info = tmp_path / "shadow-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text("[tf_tput.systems]\nmtf = shadow\nextra = shadow\n")
  child = subprocess.run(
      [sys.executable, "-c", "import json; from tf_tput import systems; "
       "print(json.dumps(systems.REGISTRY))"], capture_output=True, text=True, check=True,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_DIR.parent),
                                                       str(tmp_path)])))
  registry = json.loads(child.stdout)
  assert registry["mtf"] == systems.BUILT_IN["mtf"] and registry["extra"] == "shadow"


def test_launch_starts_the_command_on_every_worker_for_tf2_in_either_flag_form():
  """`--system tf2` (absl's other form) must take the every-worker path as
  `--system=tf2` does: each copy of the command is a worker, none a chief."""
  # One write per line: under PYTHONUNBUFFERED print writes the text and its newline
  # apart, and the two workers' lines could interleave on the shared pipe.
  show = ("import json, os, sys; "
          "sys.stdout.write(str(json.loads(os.environ['TF_CONFIG'])['task']) + '\\n')")
  for form in (["--system=tf2"], ["--system", "tf2"]):
    proc = subprocess.run([sys.executable, "-m", "tf_tput.launch", "--num_workers=2",
                           *EXPOSE, "--", sys.executable, "-c", show, *form],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    tasks = sorted(proc.stdout.split("\n")[:-1])
    assert tasks == ["{'type': 'worker', 'index': 0}", "{'type': 'worker', 'index': 1}"]


def _protocol_members(cls) -> set:
  methods = {name for name, value in vars(cls).items()
             if callable(value) and not name.startswith("_")}
  return set(cls.__annotations__) | methods


def _doc_table(heading: str) -> set:
  """First-column names of the table under `heading` in docs/extending.md, without
  backticks and arguments."""
  text = (PACKAGE_DIR.parent / "docs" / "extending.md").read_text()
  section = text.split(f"\n{heading}\n", 1)[1].split("\n#", 1)[0]
  rows = [line for line in section.splitlines() if line.startswith("| `")]
  return {row.split("|")[1].strip().strip("`").split("(")[0] for row in rows}


@pytest.mark.parametrize("heading, protocol", [
    ("### The System", "tf_tput.systems.System"),
    ("### The Trainer", "tf_tput.systems.Trainer"),
    ("### The Runtime", "tf_tput.runtime.Runtime"),
])
def test_extending_md_lists_exactly_the_interface(heading, protocol):
  import importlib
  module, name = protocol.rsplit(".", 1)
  cls = getattr(importlib.import_module(module), name)
  assert _doc_table(heading) == _protocol_members(cls), (
      f"docs/extending.md '{heading}' and {protocol} differ; update the table")


def test_an_unknown_ray_placement_is_one_line_naming_the_strategies():
  experiment = config.load_experiment(["t5_tiny", "data2"],
                                      ["RayOptions.placement = 'SCATTER'"],
                                      systems.options("ray"))
  with pytest.raises(UsageError, match="'SCATTER'; choose one of SPREAD, PACK") as e:
    systems.load("ray").check(experiment, "local")
  assert "\n" not in str(e.value)


def test_a_plugin_that_does_not_subclass_the_interface_is_one_usage_error(monkeypatch):
  import types
  module = types.ModuleType("not_a_system")
  module.SYSTEM = types.SimpleNamespace(name="plain", runtime=object())
  monkeypatch.setitem(sys.modules, "not_a_system", module)
  monkeypatch.setitem(systems.REGISTRY, "plain", "not_a_system")
  with pytest.raises(UsageError, match="subclass them"):
    systems.load("plain")


_DEAD_LOG = ("$ python -m tf_tput.train --system=mtf\n\n"
             "WARNING: All log messages before absl::InitializeLog() is called are written\n"
             "I0000 00:00:1 cpu_feature_guard.cc:210] This TensorFlow binary is optimized\n"
             "To enable the following instructions: AVX2 FMA, rebuild TensorFlow\n"
             "W1207 12:00:00.1 TF-TRT Warning: Could not find TensorRT\n"
             "Traceback (most recent call last):\nValueError: bad\n")


def test_a_dead_process_s_log_tail_leaves_out_its_runtime_s_start_up_notices(tmp_path):
  """Blank and absl lines always (runtime/processes.py); a framework's own notices are
  its runtime's startup_noise: a TF worker's tail leaves out TF's, and the suite's,
  of a run that may have loaded any framework, every registered runtime's."""
  from tf_tput.runtime import processes
  from tf_tput.suite import __main__ as suite_main
  from tf_tput.systems.tensorflow import runtime as tf_runtime
  log = tmp_path / "run.log"
  log.write_text(_DEAD_LOG)
  last_words = "Traceback (most recent call last): | ValueError: bad"
  assert processes.log_tail(log, 10, "(empty)", tf_runtime.RUNTIME.startup_noise) == last_words
  assert processes.log_tail(log, 10, "(empty)").startswith("To enable the following")
  assert suite_main._outcome("exit code 1", [], log) == (
      "died", f"exit code 1, no record written; log {log}: {last_words}")
  assert runtime_lib.Runtime.startup_noise == ()
