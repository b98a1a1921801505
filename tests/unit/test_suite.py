"""tf_tput/suite: suite files -> runs, run keys <-> record keys, bad suite input, and
the checks of a run's shape its validation shares with train (preflight.check_shape)."""

import dataclasses
import json
import sys

import pytest

from tf_tput import config, preflight
from tf_tput import suite as suites
from tf_tput.records import keys, results
from tf_tput.errors import UsageError
from tf_tput.request import Request
from tf_tput.runtime import launchers
from tf_tput.suite import __main__ as suite_main, shares

from record_fixtures import micro_record, train_record

SUITES = ["table1_local", "decoder_local", "micro_local", "table1_paper", "table2_local",
          "table2_paper", "islands_local", "islands_paper", "islands_pipeline_local",
          "controllers_local", "cluster_local"]


@pytest.mark.parametrize("name", SUITES)
def test_every_suite_loads_and_every_run_validates(name):
  runs = suites.expand(suites.load(f"gin/suites/{name}.gin"))
  assert runs and len({r.key for r in runs}) == len(runs)
  for run in runs:
    assert suites.validate(run)  # raises UsageError for a run train would refuse


def test_shipped_suites_are_the_tested_ones():
  assert suites.available() == sorted(f"gin/suites/{n}.gin" for n in SUITES)


def test_table1_local_runs_every_model_through_every_system():
  runs = suites.expand(suites.load("table1_local"))
  assert [(r.flags["gin_file"][0], r.flags["system"]) for r in runs] == [
      (f"gin/models/{m}.gin", s) for m in ("t5_tiny", "t5_small", "t5_base")
      for s in ("mtf", "jax")] + [
      (f"gin/models/{m}.gin", s) for m in ("t5_tiny", "t5_small")
      for s in ("mtf", "jax", "tf2")] + [
      (f"gin/models/{m}.gin", "torch") for m in ("t5_tiny", "t5_small")]
  # torch's 4 devices are 4 launched processes of one; the others' 4 virtual devices.
  assert all(r.module == suites.TRAIN_MODULE for r in runs)
  assert [(r.flags["num_cpu_devices"], r.launcher) for r in runs[-2:]] == [
      (1, ("--num_processes=4",))] * 2
  assert all(r.flags["num_cpu_devices"] == 4 and not r.launcher for r in runs[:-2])
  args = runs[0].args("out.jsonl")
  assert "--gin_param=TrainConfig.steps = 8" in args and args[-1] == "--results=out.jsonl"


def test_controllers_local_sets_the_four_architectures_side_by_side():
  """On 2 devices: jax and torch as 2 launched processes, mtf as 2 TF worker servers
  it drives, ray as 2 actors of one driver process; on 1, each alone."""
  runs = suites.expand(suites.load("controllers_local"))
  how = {(r.flags["system"], r.flags["gin_file"][1], r.launcher,
          r.flags.get("num_cpu_devices")) for r in runs
         if r.flags["gin_file"][0] == "gin/models/t5_tiny.gin"}
  assert how == {
      *((s, "gin/mesh/single.gin", (), 1) for s in ("mtf", "jax", "ray", "torch")),
      ("jax", "gin/mesh/data2.gin", ("--num_processes=2",), 1),
      ("torch", "gin/mesh/data2.gin", ("--num_processes=2",), 1),
      ("mtf", "gin/mesh/data2.gin", ("--num_workers=2", "--devices_per_worker=1"), None),
      ("ray", "gin/mesh/data2.gin", (), 2)}, how


def test_table1_paper_uses_the_papers_device_counts():
  devices = {}
  for run in suites.expand(suites.load("table1_paper")):
    model = run.flags["gin_file"][0].split("/")[-1][:-4]
    devices[model] = suites.validate(run).split(" devices")[0].split(", ")[-1]
  assert devices == {"t5_base": "32", "t5_large": "32", "t5_3b": "512", "t5_11b": "512"}


def _train_key(run, commit=None) -> str:
  """The key tf_tput.train stores for this run's command line (its _record's call)."""
  return keys.run_key(run.flags["system"], run.flags["gin_file"], run.flags["gin_param"],
                      run.flags.get("num_cpu_devices"), run.strategy,
                      keys.code_version() if commit is None else commit)


def test_a_train_record_has_the_key_of_its_run():
  run, other = suites.expand(suites.load("table1_local"))[:2]
  record = train_record(run_key=_train_key(run))
  assert suites.record_key(record) == run.key != other.key
  assert suites.done_keys([record]) == {run.key}
  assert suites.done_keys([train_record(status="failed", run_key=run.key)]) == set()


def test_a_micro_record_has_the_key_of_its_run():
  runs = suites.expand(suites.load("micro_local"))
  tf_opbyop = next(r for r in runs if r.label == "micro tf opbyop 1 host(s) x 2")
  record = micro_record("tf", "opbyop", hosts=1, run_key=keys.micro_run_key(
      "tf", "opbyop", 1, 2, 128, 1024, 0, keys.code_version()))
  assert suites.record_key(record) == tf_opbyop.key
  key_of = {r.label.split(" 1 host")[0]: r.key for r in runs if " 1 host" in r.label}
  jax_chained = micro_record("jax", "chained", status="not_applicable",
                             run_key=key_of["micro jax chained"])
  ray = micro_record("ray", "fused", status="skipped", run_key=key_of["micro ray fused"])
  assert micro_record(run_key=keys.micro_run_key(
      "tf", "opbyop", 1, 2, 128, 1024, 0, "another commit"))["run_key"] != tf_opbyop.key
  done = suites.done_keys([record, jax_chained, ray])
  assert suites.record_key(jax_chained) in done   # nothing to redo
  assert suites.record_key(ray) not in done       # the extra may be installed now


def _write(tmp_path, text: str) -> str:
  path = tmp_path / "s.gin"
  path.write_text(text)
  return str(path)


GOOD = ("Suite.name = 's'\nSuite.matrices = [@TrainMatrix()]\n"
        "TrainMatrix.models = ['t5_tiny']\n")


@pytest.mark.parametrize("extra, expect", [
    ("TrainMatrix.modles = ['t5_tiny']\n", "modles"),
    ("TrainMatrix.models = ['t5_huge']\n", "'t5_huge'"),
    ("TrainMatrix.meshes = ['data3']\n", "'data3'"),
    ("TrainMatrix.systems = ['pax']\n", "'pax'"),
    ("TrainMatrix.dtypes = ['float16']\n", "'float16'"),
    ("TrainMatrix.models = []\n", "TrainMatrix.models = []"),
    ("TrainMatrix.models = 't5_tiny'\n", "TrainMatrix.models = 't5_tiny'"),
    ("TrainMatrix.global_batches = [0]\n", "global_batches has 0"),
    ("TrainMatrix.steps = 0\n", "TrainMatrix.steps = 0"),
    ("TrainMatrix.global_batches = [6]\nTrainMatrix.meshes = ['data4']\n"
     "TrainMatrix.num_cpu_devices = 4\n", "batch = 6 is not divisible"),
    ("Suite.matrices = [@MicroMatrix()]\nMicroMatrix.modes = ['batched']\n", "'batched'"),
    ("Suite.matrices = [@MicroMatrix()]\nMicroMatrix.computations = 100\n", "multiple"),
    ("Suite.matrices = []\n", "Suite.matrices = []"),
    ("Suite.name = ''\n", "Suite.name = ''"),
    ("Suite.name = \n", "line 4"),
    ("Nope.x = 1\n", "Nope"),
    ("TrainMatrix.strategy = 'tpu'\n", "trains in bfloat16 activations"),
    ("TrainMatrix.strategy = 'multi_worker'\nTrainMatrix.num_cpu_devices = 1\n",
     "--num_cpu_devices applies to --strategy=local"),
    ("TrainMatrix.systems = ['mtf']\n"
     "TrainMatrix.gin_params = [\"ModelConfig.embedding = 'gather'\"]\n",
     "--system=mtf computes only one_hot"),
])
def test_bad_suite_input_is_one_line_naming_it(tmp_path, extra, expect):
  path = _write(tmp_path, GOOD + extra)
  with pytest.raises(UsageError) as info:
    for run in suites.expand(suites.load(path)):
      suites.validate(run)
  assert expect in str(info.value) and "\n" not in str(info.value)


def test_missing_suite_file_names_the_suites():
  with pytest.raises(UsageError, match="table1_local.gin"):
    suites.load("gin/suites/nope.gin")


def test_missing_bindings_say_what_to_bind(tmp_path):
  with pytest.raises(UsageError, match="Suite.name"):
    suites.load(_write(tmp_path, "TrainMatrix.models = ['t5_tiny']\n"))


def test_time_left_uses_the_same_group_else_the_mean():
  runs = suites.expand(suites.load("table1_local"))
  assert "unknown" in suite_main.time_left(runs, {})
  assert suite_main.time_left(runs[1:2], {"t5_tiny": [10.0]}) == "~10s left for 1 run(s)"
  estimate = suite_main.time_left(runs[2:4], {"t5_tiny": [10.0, 30.0]})
  assert estimate == "~40s left for 2 run(s) (2 of them guessed from the mean of others)"
  assert suite_main.time_left([], {"t5_tiny": [1.0]}) == "none left"


def test_paper_suites_run_mtf_on_the_tpu_strategy_and_jax_locally():
  runs = suites.expand(suites.load("table2_paper"))
  strategies = {r.flags["system"]: r.flags.get("strategy") for r in runs}
  assert strategies == {"mtf": "tpu", "jax": None}
  mtf_run = next(r for r in runs if r.flags["system"] == "mtf")
  assert "--strategy=tpu" in mtf_run.args("out.jsonl") and " tpu " in mtf_run.label
  assert _train_key(mtf_run) == mtf_run.key
  # The same run under another strategy measures something else.
  local = keys.run_key("mtf", mtf_run.flags["gin_file"], mtf_run.flags["gin_param"], None,
                       "local", keys.code_version())
  assert local != mtf_run.key


def _gin_files(tmp_path, common: str) -> str:
  """A model file that includes another, as gin/models/t5_small.gin does."""
  (tmp_path / "common.gin").write_text(common)
  model = tmp_path / "model.gin"
  model.write_text(f"include '{tmp_path / 'common.gin'}'\nModelConfig.d_model = 64\n")
  return str(model)


def test_the_key_changes_with_an_included_files_content_the_commit_and_the_bindings(
    tmp_path):
  model = _gin_files(tmp_path, "ModelConfig.num_layers = 2\n")
  args = ("jax", [model, "gin/mesh/single.gin"], ["TrainConfig.steps = 3"], 1, "local")
  key = keys.run_key(*args, "abc123")
  assert keys.run_key(*args, "abc123") == key                         # same inputs
  assert keys.run_key(*args, "abc123+dirty.0f0f") != key              # other code
  assert keys.run_key(*args[:2], ["TrainConfig.steps = 4"], *args[3:], "abc123") != key
  assert keys.run_key(*args[:2], [*args[2], "TrainConfig.sync_every = 4"], *args[3:],
                      "abc123") != key                                # any binding
  _gin_files(tmp_path, "ModelConfig.num_layers = 3\n")               # edit the include
  assert keys.run_key(*args, "abc123") != key
  _gin_files(tmp_path, "ModelConfig.num_layers = 2\n")               # and back
  assert keys.run_key(*args, "abc123") == key


def test_the_shipped_models_key_their_included_common_file():
  names = [name for name, _ in keys.gin_sources(["gin/models/t5_small.gin"])]
  assert names == ["gin/models/t5_small.gin", "gin/models/t5_common.gin"]


def test_an_old_record_without_a_run_key_is_read_but_matches_no_run(tmp_path):
  run = suites.expand(suites.load("table1_local"))[0]
  old = train_record(run_key=run.key)
  del old["run_key"]
  with pytest.raises(ValueError, match="missing run_key"):
    results.validate(old)                       # new records must have it
  path = tmp_path / "old.jsonl"
  path.write_text(json.dumps(old) + "\n")
  records, problems = results.read(str(path))
  assert problems == [] and records[0]["status"] == "ok"
  assert suites.done_keys(records) == set()     # so the suite measures it again


def test_dry_run_refuses_what_train_would_refuse_for_the_strategy(tmp_path):
  path = _write(tmp_path, GOOD + "TrainMatrix.systems = ['mtf']\n"
                "TrainMatrix.strategy = 'tpu'\n")
  [run] = suites.expand(suites.load(path))
  with pytest.raises(UsageError) as info:
    suites.validate(run)
  message = str(info.value)
  assert message.startswith("run 't5_tiny mtf tpu float32 single batch 8': ")
  assert "--strategy=tpu trains in bfloat16 activations" in message
  assert "TrainMatrix.dtypes" in message and "\n" not in message


def test_train_flags_reach_train_runs_only_and_may_not_change_what_is_measured():
  suites.check_train_flags(["--tpu=local", "--cluster_timeout_s=120"])
  train_run = suites.expand(suites.load("table1_local"))[0]
  micro_run = suites.expand(suites.load("micro_local"))[0]
  assert train_run.command("r.jsonl", ["--tpu=local"])[-1] == "--tpu=local"
  assert "--tpu=local" not in micro_run.command("r.jsonl", ["--tpu=local"])
  for flag in ("--strategy=tpu", "--steps=3", "--gin_param=X.y = 1", "--results=x"):
    with pytest.raises(UsageError, match="decides what a run measures"):
      suites.check_train_flags([flag])
  with pytest.raises(UsageError, match="is not a flag"):
    suites.check_train_flags(["tpu=local"])


def test_table2_suites_hold_batch_and_length_constant_across_partitionings():
  """The paper's pitfall: every row of a Table 2 suite trains the same global batch
  and length on the same devices (per core count), only the partitioning differs."""
  for name, shapes in (("table2_local", {(1, 1), (2, 8), (4, 16)}),
                       ("table2_paper", {(1, 1), (4, 16), (8, 32), (16, 64)})):
    by_devices = {}
    for run in suites.expand(suites.load(name)):
      experiment = config.load_experiment(run.flags["gin_file"], run.flags["gin_param"])
      p = experiment.pipeline
      by_devices.setdefault(experiment.num_devices, set()).add(
          (experiment.train.global_batch, experiment.data.targets_length,
           (p.stages, p.micro_batches)))
    seen = set()
    for rows in by_devices.values():
      assert len({(batch, length) for batch, length, _ in rows}) == 1, (name, rows)
      seen |= {shape for _, _, shape in rows}
    assert seen == shapes, name
  paper = {run.label for run in suites.expand(suites.load("table2_paper"))}
  assert len(paper) == 6  # SPMD for both systems, four pipelines for jax


def test_islands_local_runs_under_the_launcher_with_one_key_per_link():
  runs = suites.expand(suites.load("islands_local"))
  jax = [run for run in runs if run.flags["system"] == "jax"]
  assert [run.launcher for run in jax] == [("--num_processes=2", "--islands=1")] + [
      ("--num_processes=2", "--islands=2", f"--dcn_rate={rate}")
      for rate in ("none", "100mbit", "20mbit")]
  command = jax[1].command("out.jsonl")
  assert command[1:3] == ["-m", "tf_tput.launch"] and "--" in command
  assert command[command.index("--") + 2:command.index("--") + 4] == ["-m", "tf_tput.train"]
  assert len({run.key for run in runs}) == 16  # jax, mtf, torch, ray: 4 links each


def test_ray_islands_runs_are_ray_nodes_driven_locally_with_the_key_train_computes():
  runs = [run for run in suites.expand(suites.load("islands_local"))
          if run.flags["system"] == "ray"]
  assert [run.launcher for run in runs] == [
      ("--num_workers=2", "--islands=1", "--devices_per_worker=1")] + [
      ("--num_workers=2", "--islands=2", f"--dcn_rate={rate}", "--devices_per_worker=1")
      for rate in ("none", "100mbit", "20mbit")]
  # the driver runs locally: one actor per node's CPU, as many devices as nodes
  assert all(run.strategy == "local" and run.flags["num_cpu_devices"] == 2
             and "strategy" not in run.flags for run in runs)
  assert runs[-1].key == keys.run_key("ray", runs[-1].flags["gin_file"],
                                      runs[-1].flags["gin_param"], 2, "local",
                                      keys.code_version(),
                                      keys.launch_fields(1, 2, "20mbit"))


def test_mtf_islands_runs_are_tf_workers_with_the_key_train_computes():
  runs = [run for run in suites.expand(suites.load("islands_local"))
          if run.flags["system"] == "mtf"]
  assert [run.launcher for run in runs] == [
      ("--num_workers=2", "--islands=1", "--devices_per_worker=4")] + [
      ("--num_workers=2", "--islands=2", f"--dcn_rate={rate}", "--devices_per_worker=4")
      for rate in ("none", "100mbit", "20mbit")]
  assert all(run.strategy == "multi_worker" and "num_cpu_devices" not in run.flags
             and run.flags["strategy"] == "multi_worker" for run in runs)
  assert "2 workers, 2 islands at 20mbit" in runs[-1].label
  # train's key under the launcher: the chief is one process, the islands from the env
  fields = keys.launch_fields(1, 2, "20mbit")
  assert runs[-1].key == keys.run_key("mtf", runs[-1].flags["gin_file"],
                                      runs[-1].flags["gin_param"], None, "multi_worker",
                                      keys.code_version(), fields)


def test_islands_paper_splits_the_model_inside_islands_for_mtf():
  runs = suites.expand(suites.load("islands_paper"))
  assert {run.flags["system"] for run in runs} == {"mtf"}
  assert [run.launcher for run in runs] == [
      ("--num_workers=256", "--islands=1", "--devices_per_worker=4"),
      ("--num_workers=256", "--islands=2", "--dcn_rate=none", "--devices_per_worker=4"),
      ("--num_workers=512", "--islands=1", "--devices_per_worker=4"),
      ("--num_workers=512", "--islands=2", "--dcn_rate=none", "--devices_per_worker=4")]
  for run in runs:
    assert "params" in suites.validate(run)  # model axes inside islands pass for mtf


def test_a_model_axis_across_islands_is_refused_for_jax():
  run = next(r for r in suites.expand(suites.load("islands_paper")) if "islands=2" in
             " ".join(r.launcher))
  # jax under the strategy a matrix gives it (local): the model axis is its one fault.
  flags = {name: value for name, value in run.flags.items() if name != "strategy"}
  jax = dataclasses.replace(run, flags={**flags, "system": "jax"}, strategy="local")
  with pytest.raises(UsageError, match="split the model"):
    suites.validate(jax)


def test_islands_pipeline_local_puts_one_stage_in_each_of_four_islands():
  runs = suites.expand(suites.load("islands_pipeline_local"))
  assert len(runs) == 8 and len({run.key for run in runs}) == 8
  for run in runs:
    assert "gin/pipeline/s4_m16.gin" in run.flags["gin_file"]
    assert "4 stages x 16 micro-batches" in suites.validate(run)
  jax = [run.launcher for run in runs if run.flags["system"] == "jax"]
  assert jax == [("--num_processes=4", "--islands=1")] + [
      ("--num_processes=4", "--islands=4", f"--dcn_rate={rate}")
      for rate in ("none", "100mbit", "20mbit")]
  three = dataclasses.replace(runs[1], launcher=("--num_processes=4", "--islands=3"))
  with pytest.raises(UsageError, match="stages = 4 across 3 islands"):
    suites.validate(three)


def test_srun_starts_each_run_of_cluster_local_as_one_step_of_its_tasks():
  runs = suites.expand(suites.load("cluster_local"))
  tasks = {r.flags["system"]: r.command("r.jsonl", launcher="srun")[:len(suites.SRUN) + 1]
           for r in runs}
  assert tasks == {"jax": [*suites.SRUN, "--ntasks=2"], "torch": [*suites.SRUN, "--ntasks=2"],
                   "tf2": [*suites.SRUN, "--ntasks=2"],  # every worker runs the program
                   "mtf": [*suites.SRUN, "--ntasks=3"]}  # the chief and its 2 workers
  assert all(r.command("r.jsonl", launcher="srun")[len(suites.SRUN) + 1:][:2] == [
      sys.executable, "-m"]
             for r in runs)


def test_srun_refuses_what_a_slurm_step_cannot_be():
  islands = next(r for r in suites.expand(suites.load("islands_local"))
                 if any(f.startswith("--islands=") for f in r.launcher))
  with pytest.raises(UsageError, match="--launcher=srun cannot make islands"):
    islands.command("r.jsonl", launcher="srun")
  mtf = suites.expand(suites.load("cluster_local"))[-1]
  wide = dataclasses.replace(mtf, launcher=("--num_workers=2", "--devices_per_worker=2"))
  with pytest.raises(UsageError, match="runs a worker server as one task with one device"):
    wide.command("r.jsonl", launcher="srun")


def test_a_run_the_slurm_job_cannot_hold_is_one_line_naming_it_and_the_options():
  runs = suites.expand(suites.load("cluster_local"))  # 2, 2, 2 and 3 (mtf) tasks
  suites.check_allocation(runs, launchers.SlurmAllocation(3, 1, False))
  suites.check_allocation(runs, launchers.SlurmAllocation(1, 1, True))  # --overcommit
  with pytest.raises(UsageError) as raised:
    suites.check_allocation(runs, launchers.SlurmAllocation(2, 1, False))
  assert str(raised.value).startswith("run 't5_tiny mtf multi_worker float32 data2 batch 8 "
                                      "2 workers' is a job step of 3 tasks")
  assert "sbatch --ntasks=3" in str(raised.value) and "--overcommit" in str(raised.value)
  with pytest.raises(UsageError, match="'t5_tiny mtf multi_worker float32 data2 batch 8 "
                     "2 workers' is a job step of 3 tasks and this job has 2 CPU"):
    suites.check_allocation(runs[:1] + runs[-1:], launchers.SlurmAllocation(2, 2, False))
  # The widest run is named even where an earlier one does not fit either: its
  # options hold every other run.
  with pytest.raises(UsageError, match="sbatch --ntasks=3"):
    suites.check_allocation(runs, launchers.SlurmAllocation(1, 1, False))


def test_a_retried_run_s_log_is_kept_beside_the_earlier_attempt_s(tmp_path):
  run = suites.expand(suites.load("cluster_local"))[0]
  first = suite_main._log_path(tmp_path, run)
  first.write_text("interrupted\n")
  second = suite_main._log_path(tmp_path, run)
  second.write_text("ok\n")
  assert second.name == first.name.replace(".log", ".attempt2.log")
  assert suite_main._log_path(tmp_path, run).name.endswith(".attempt3.log")


def test_the_resume_advice_of_an_array_task_requeues_that_task_only():
  task = shares.ArrayTask("14", 2, 0, 3, 1, 4)
  assert suite_main._resume(task) == "requeue this array task (scontrol requeue 14_2)"
  assert suite_main._resume(None) == "rerun the same command"


# preflight.check_shape: the checks of a run's shape that tf_tput.train's preflight, a
# suite's validation and tf_tput.plan share, each entry point saying them in its own
# words.

TINY = "gin/models/t5_tiny.gin"


def _experiment(*files, model=TINY, params=()):
  return config.load_experiment([model, *files], list(params))


def _matrix_runs(tmp_path, text: str) -> list:
  path = tmp_path / "s.gin"
  path.write_text("Suite.name = 's'\nSuite.matrices = [@TrainMatrix()]\n"
                  "TrainMatrix.models = ['t5_tiny']\n" + text)
  return suites.expand(suites.load(str(path)))


def _launched_by_launch(monkeypatch, processes: int, islands: int = 0) -> None:
  """The environment tf_tput.launch gives process 0 of `processes` (in `islands`)."""
  monkeypatch.setenv("TF_TPUT_NUM_PROCESSES", str(processes))
  monkeypatch.setenv("TF_TPUT_PROCESS_ID", "0")
  monkeypatch.setenv("TF_TPUT_COORDINATOR", "127.0.0.1:12345")
  if islands:
    monkeypatch.setenv("TF_TPUT_NUM_ISLANDS", str(islands))


def test_several_processes_of_a_one_process_system_in_trains_and_the_suites_words(
    tmp_path, monkeypatch):
  with pytest.raises(preflight.OneProcessError) as shape:
    preflight.check_shape("mtf", _experiment(), num_processes=2)
  assert str(shape.value).startswith("--system=mtf runs as one process (a single "
                                     "controller), not as 2 processes of tf_tput.launch")
  _launched_by_launch(monkeypatch, 2)
  with pytest.raises(UsageError) as train:
    preflight.check(Request(gin_file=(TINY,), system="mtf",
                            results=str(tmp_path / "r.jsonl")))
  assert str(train.value) == str(shape.value)
  # A matrix's processes: mtf's become worker servers, a one-process system's are refused.
  [run] = _matrix_runs(tmp_path, "TrainMatrix.systems = ['pathways']\n"
                       "TrainMatrix.processes = 2\n")
  with pytest.raises(UsageError) as suite:
    suites.validate(run)
  assert str(suite.value) == (
      f"run {run.label!r}: --system=pathways runs as one process, not under "
      "tf_tput.launch --num_processes (TrainMatrix.processes)")


def test_a_chief_of_worker_servers_runs_among_another_launchers_processes():
  experiment = _experiment()
  preflight.check_shape("mtf", experiment, strategy="multi_worker", num_processes=3,
                        launcher="slurm")  # task 0 drives the other two
  with pytest.raises(preflight.OneProcessError, match="srun with --strategy=multi_worker"):
    preflight.check_shape("mtf", experiment, strategy="multi_worker", num_processes=3)


def test_a_system_whose_every_worker_runs_the_program_needs_multi_worker():
  with pytest.raises(UsageError, match="runs as several processes only as the workers"):
    preflight.check_shape("tf2", _experiment(), num_processes=2)


def test_islands_for_a_system_without_them_in_trains_and_the_suites_words(
    tmp_path, monkeypatch):
  with pytest.raises(preflight.NoIslandsError) as shape:
    preflight.check_shape("tf2", _experiment(), num_islands=2)
  assert str(shape.value).startswith("--system=tf2 does not train across islands; use ")
  assert str(shape.value).endswith(" under tf_tput.launch --islands")
  _launched_by_launch(monkeypatch, 1, islands=2)
  with pytest.raises(UsageError) as train:
    preflight.check(Request(gin_file=(TINY,), system="tf2",
                            results=str(tmp_path / "r.jsonl")))
  assert str(train.value) == str(shape.value)
  run = _matrix_runs(tmp_path, "TrainMatrix.systems = ['tf2']\n"
                     "TrainMatrix.processes = 2\nTrainMatrix.islands = [2]\n")[0]
  with pytest.raises(UsageError) as suite:
    suites.validate(run)
  assert str(suite.value) == f"run {run.label!r}: --system=tf2 does not train across islands"


def test_the_strategys_refusal_carries_the_suites_hint_only_in_a_suite(tmp_path):
  with pytest.raises(preflight.StrategyError) as shape:
    preflight.check_shape("mtf", _experiment(), strategy="tpu")
  assert str(shape.value).startswith("--strategy=tpu trains in bfloat16 activations")
  [run] = _matrix_runs(tmp_path, "TrainMatrix.systems = ['mtf']\n"
                       "TrainMatrix.strategy = 'tpu'\n")
  with pytest.raises(UsageError) as suite:
    suites.validate(run)
  assert str(suite.value) == (f"run {run.label!r}: {shape.value} (in the suite file: "
                              "TrainMatrix.dtypes, strategy, num_cpu_devices)")


def test_the_devices_of_processes_and_of_workers_against_the_mesh():
  data4 = _experiment("gin/mesh/data4.gin")
  preflight.check_shape("jax", data4, num_processes=2, num_cpu_devices=2)
  with pytest.raises(UsageError, match="has 4 devices but 6 are available"):
    preflight.check_shape("jax", data4, num_processes=3, num_cpu_devices=2)
  preflight.check_shape("mtf", data4, strategy="multi_worker", workers=(2, 2))
  with pytest.raises(UsageError, match="has 4 devices but 2 are available"):
    preflight.check_shape("mtf", data4, strategy="multi_worker", workers=(2, 1))


def test_with_no_system_only_the_islands_split_is_checked_as_the_most_able_would():
  model = _experiment("gin/mesh/data2_model2.gin")
  preflight.check_shape(None, model)                 # no islands: nothing to check
  preflight.check_shape(None, model, num_islands=2)  # model axes inside islands
  with pytest.raises(UsageError, match="split the model"):
    preflight.check_shape("jax", model, num_islands=2)
  pipelined = _experiment("gin/mesh/data2.gin", "gin/pipeline/s4_m16.gin",
                          model="gin/models/decoder_deep.gin",
                          params=["TrainConfig.global_batch = 32"])
  preflight.check_shape(None, pipelined, num_islands=4)
  with pytest.raises(UsageError, match="stages = 4 across 3 islands"):
    preflight.check_shape(None, pipelined, num_islands=3)
