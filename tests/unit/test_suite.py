"""tf_tput/suite: suite files -> runs, run keys <-> record keys, bad suite input."""

import pytest

from tf_tput import suite as suites
from tf_tput.errors import UsageError
from tf_tput.suite import __main__ as suite_main

from record_fixtures import micro_record, train_record

SUITES = ["table1_local", "decoder_local", "micro_local", "table1_paper", "table2_paper"]


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
      for s in ("mtf", "jax")]
  assert all(r.flags["num_cpu_devices"] == 4 and r.module == suites.TRAIN_MODULE
             for r in runs)
  args = runs[0].args("out.jsonl")
  assert "--gin_param=TrainConfig.steps = 8" in args and args[-1] == "--results=out.jsonl"


def test_table1_paper_uses_the_papers_device_counts():
  devices = {}
  for run in suites.expand(suites.load("table1_paper")):
    model = run.flags["gin_file"][0].split("/")[-1][:-4]
    devices[model] = suites.validate(run).split(" devices")[0].split(", ")[-1]
  assert devices == {"t5_base": "32", "t5_large": "32", "t5_3b": "512", "t5_11b": "512"}


def _train_flags_as_recorded(run) -> dict:
  """The `flags` tf_tput.train records for this run's command line."""
  recorded = {name: None for name in ("gin_file", "gin_param", "system", "results",
                                      "num_cpu_devices", "steps", "warmup_steps",
                                      "global_batch", "tensorboard_dir", "log_every")}
  recorded.update(run.flags, results="somewhere.jsonl", log_every=10)
  return recorded


def test_a_train_record_has_the_key_of_its_run():
  run, other = suites.expand(suites.load("table1_local"))[:2]
  record = train_record(flags=_train_flags_as_recorded(run))
  assert suites.record_key(record) == run.key != other.key
  assert suites.done_keys([record]) == {run.key}
  assert suites.done_keys([train_record(status="failed",
                                        flags=_train_flags_as_recorded(run))]) == set()


def test_a_micro_record_has_the_key_of_its_run():
  runs = suites.expand(suites.load("micro_local"))
  tf_opbyop = next(r for r in runs if r.label == "micro tf opbyop 1 host(s) x 2")
  record = micro_record("tf", "opbyop", hosts=1)
  assert suites.record_key(record) == tf_opbyop.key
  jax_chained = micro_record("jax", "chained", status="not_applicable")
  ray = micro_record("ray", "fused", status="skipped")
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
    ("TrainMatrix.systems = ['pathways']\n", "'pathways'"),
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
  record = train_record(flags=dict(_train_flags_as_recorded(mtf_run), strategy="tpu"))
  assert suites.record_key(record) == mtf_run.key
  # The same run recorded under another strategy measured something else.
  local = train_record(flags=dict(_train_flags_as_recorded(mtf_run), strategy="local"))
  assert suites.record_key(local) != mtf_run.key


def test_a_local_run_keeps_the_key_of_records_written_before_strategy_existed():
  run = suites.expand(suites.load("table1_local"))[0]
  for stored in ({}, {"strategy": "local"}):
    record = train_record(flags=dict(_train_flags_as_recorded(run), **stored))
    assert suites.record_key(record) == run.key


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
