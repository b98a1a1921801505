"""Every request the pre-flight check accepts ends in a record: a failure anywhere
after it (device resolution, the peak probe, batch building, the build, a step, the
record's schema) appends a `failed` record naming the stage and its cause, prints
one error line and exits 1; where no record can be appended, one line says so.

The failures are injected into tf_tput.train's own code, run in one process for all
cases (one subprocess: train's flags and other entry points' cannot share pytest's),
with the toy system of toy_system.py so that nothing but train's code takes time.
Connections that never answer (a Cloud TPU, the JAX coordinator, TF workers) fail
for real, within --cluster_timeout_s.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from tf_tput.records import results
from tf_tput.runtime import processes

from cli_helpers import REPO, error_lines, run_cli

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs tf_tput.train's main in this process once per case, each with its failure
# injected; prints {case: {code, stderr, raw file, records}} as JSON.
DRIVER = r'''
import contextlib, io, json, os, resource, sys
from unittest import mock
sys.path.insert(0, sys.argv[1])
import numpy as np
from absl import flags
from tf_tput import systems
systems.REGISTRY["toy"] = "toy_system"
from tf_tput import train
from tf_tput.errors import UsageError
from tf_tput.records import results
import toy_system

real_validate, real_build = results.validate, toy_system.ToySystem.build


def build_with(**attributes):
  def build(self, experiment, topology):
    trainer = real_build(self, experiment, topology)
    vars(trainer).update(attributes)
    return trainer
  return build


def refuse_after_first(record, written_now=True):
  refuse_after_first.calls += 1
  if refuse_after_first.calls > 1:
    raise ValueError("everything is wrong")
  real_validate(record, written_now)
refuse_after_first.calls = 0


def step_fails(self, batch):
  raise FloatingPointError("the loss is nan")


PROBED = ("tf_tput.measure.peak.probe_alone", mock.Mock(return_value=(1e11, "table:toy")))
CASES = {
    "ok": [],
    "devices": [("toy_system.NumpyRuntime.resolve", mock.Mock(
        side_effect=ConnectionError("nothing answers at 10.0.0.1:8470")))],
    "peak": [("tf_tput.measure.peak.probe_alone",
              mock.Mock(side_effect=RuntimeError("the matmul of ones gave [0, 0] = 0")))],
    "batches": [("tf_tput.data.batches", mock.Mock(side_effect=MemoryError(
        "Unable to allocate 95.4 GiB for an array with shape (100000000, 128)")))],
    "late_usage": [("toy_system.ToySystem.build", mock.Mock(side_effect=UsageError(
        "the toy cannot build this; pass another model")))],
    "step": [("toy_system.UnigramTrainer.step", step_fails)],
    "numpy_num_params": [("toy_system.ToySystem.build",
                          build_with(num_params=np.int64(512)))],
    "schema": [("toy_system.ToySystem.build", build_with(num_params="many"))],
    "no_record": [("tf_tput.records.results.validate", refuse_after_first)],
    "append": [],  # a real failure: the file size limit below
}


@contextlib.contextmanager
def file_size_limit(path):
  """A results file that cannot take a whole record, for real: it holds two earlier
  records, and this process may write at most 100 bytes past them (RLIMIT_FSIZE;
  Python ignores SIGXFSZ, so the write is cut short, then fails with EFBIG). A new
  file of one record, the side file, still fits."""
  ok_lines = open(os.path.join(sys.argv[2], "ok.jsonl"), "rb").read()
  with open(path, "wb") as f:
    f.write(ok_lines * 2)
  soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
  resource.setrlimit(resource.RLIMIT_FSIZE, (len(ok_lines) * 2 + 100, hard))
  try:
    yield
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
out, FLAGS = {}, flags.FLAGS
for name, patches in CASES.items():
  path = os.path.join(sys.argv[2], f"{name}.jsonl")
  FLAGS.unparse_flags()
  FLAGS(["train", "--system=toy", "--gin_file=decoder_tiny", "--steps=2", "--warmup_steps=1",
         f"--results={path}"])
  err = io.StringIO()
  with contextlib.ExitStack() as stack:
    for target, value in ([PROBED] + patches):
      stack.enter_context(mock.patch(target, value))
    if name == "append":
      stack.enter_context(file_size_limit(path))
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
      code = train.main(["train"])
  raw = open(path).read() if os.path.exists(path) else ""
  out[name] = {"code": code, "stderr": err.getvalue(), "raw": raw,
               "records": [json.loads(line) for line in raw.splitlines()]}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
  directory = tmp_path_factory.mktemp("records")
  # TMPDIR: where a record that cannot be appended is kept aside.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO),
             TMPDIR=str(directory))
  done = subprocess.run([sys.executable, "-c", DRIVER, HERE, str(directory)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.splitlines()[-1])


def _failed_record(case: dict, error_start: str) -> dict:
  assert case["code"] == 1
  [line] = error_lines(case["stderr"])
  [record] = case["records"]
  results.validate(record)
  assert record["status"] == "failed" and record["error"].startswith(error_start), record
  assert record["error"] in line
  return record


def test_a_run_that_works_is_ok(cases):
  assert cases["ok"]["code"] == 0 and error_lines(cases["ok"]["stderr"]) == []
  assert [r["status"] for r in cases["ok"]["records"]] == ["ok"]


@pytest.mark.parametrize("case, error_start", [
    ("devices", "devices: ConnectionError: nothing answers at 10.0.0.1:8470"),
    ("peak", "peak probe: RuntimeError: the matmul of ones gave"),
    ("batches", "batches: MemoryError: Unable to allocate 95.4 GiB"),
    ("late_usage", "build: UsageError: the toy cannot build this"),
    ("step", "step 0: FloatingPointError: the loss is nan"),
])
def test_a_failure_after_the_check_is_a_failed_record(cases, case, error_start):
  record = _failed_record(cases[case], error_start)
  assert record["model"] == "decoder_tiny" and record["steps"] == 2
  assert record["losses"] == []
  if case in ("devices", "peak"):
    assert record["peak_flops_per_device"] is None
  else:  # probed before it failed: kept
    assert record["peak_flops_per_device"] == 1e11
  if case == "devices":  # the devices it asked for: none resolved
    assert record["num_devices"] == 1
    assert record["env"]["accelerators"][0]["platform"] == "unresolved"
    assert record["nodes"] == [] and record["num_nodes"] == 0


def test_numpy_numbers_reach_the_record_as_numbers(cases):
  [record] = cases["numpy_num_params"]["records"]
  assert record["status"] == "ok" and record["num_params"] == 512


def test_a_record_the_schema_refuses_is_written_failed_with_its_measurement(cases):
  record = _failed_record(cases["schema"], "record: the schema refused it (num_params = "
                                           "'many' has type str)")
  assert len(record["losses"]) == 3 and record["tokens_per_sec"] > 0


def test_where_no_record_can_be_made_one_line_says_so(cases):
  case = cases["no_record"]
  assert case["code"] == 1 and case["records"] == []
  [line] = error_lines(case["stderr"])
  assert ("but its record cannot be made (ValueError: everything is wrong); nothing was "
          "appended") in line, line


def test_an_append_that_fails_part_way_leaves_the_file_as_it_was(cases):
  """The results file could take 100 bytes of the record (a real file size limit):
  it ends byte for byte as before, the run exits 1 and one line names the cause and
  the side file that holds the whole record."""
  case = cases["append"]
  assert case["code"] == 1
  assert case["raw"] == cases["ok"]["raw"] * 2  # the two earlier records, nothing more
  [line] = error_lines(case["stderr"])
  assert "could not be appended to --results=" in line and "File too large" in line, line
  assert "which is left as it was; the record is in " in line, line
  side = line.split("the record is in ")[1]
  [kept] = [json.loads(text) for text in open(side)]
  results.validate(kept)
  assert kept["status"] == "ok" and kept["run_id"] in line


# --- connections that never answer --------------------------------------------------

def _times_out(proc, out, expect: str):
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  [line] = error_lines(proc.stderr)
  assert expect in line, line
  [record] = results.read(str(out))[0]
  assert record["status"] == "failed" and expect in record["error"]


@pytest.mark.loopback_ports  # a port found free must stay unanswered (tests/conftest.py)
def test_a_tpu_address_where_nothing_listens_fails_within_the_timeout(tmp_path):
  [port] = processes.free_loopback_ports(1)
  out = tmp_path / "runs.jsonl"
  start = time.monotonic()
  proc = run_cli("tf_tput.train", "--gin_file=decoder_tiny", "--strategy=tpu",
                 f"--tpu=grpc://127.0.0.1:{port}", "--cluster_timeout_s=1",
                 "--gin_param=ModelConfig.activation_dtype='bfloat16'", f"--results={out}",
                 timeout=300)
  _times_out(proc, out, f"devices: TimeoutError: --tpu=grpc://127.0.0.1:{port}: nothing "
                        f"answered at grpc://127.0.0.1:{port} within --cluster_timeout_s=1")
  assert time.monotonic() - start < 30  # probed before TensorFlow is imported: ~2 s


def _process_0_of_2(env: dict, args: list, out) -> subprocess.CompletedProcess:
  """train as process 0 of 2 launched processes whose peer never comes, on
  decoder_tiny over a batch:2 mesh, with --cluster_timeout_s=1."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO), **env,
             **{processes.NUM_PROCESSES_ENV: "2", processes.PROCESS_ID_ENV: "0"})
  return subprocess.run(
      [sys.executable, "-m", "tf_tput.train", *args, "--gin_file=decoder_tiny",
       "--gin_file=data2", "--cluster_timeout_s=1", f"--results={out}"], cwd=REPO,
      env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.loopback_ports  # the coordinator's port (tests/conftest.py)
def test_a_jax_coordinator_the_others_never_join_fails_within_the_timeout(tmp_path):
  [port] = processes.free_loopback_ports(1)
  out = tmp_path / "runs.jsonl"
  proc = _process_0_of_2({processes.COORDINATOR_ENV: f"127.0.0.1:{port}"},
                         ["--system=jax", "--num_cpu_devices=1"], out)
  _times_out(proc, out, f"devices: TimeoutError: process 0: the JAX coordinator at "
                        f"127.0.0.1:{port} did not gather all 2 processes within "
                        "--cluster_timeout_s=1")


@pytest.mark.loopback_ports  # ports found free must stay unanswered (tests/conftest.py)
def test_a_tf2_worker_that_never_joins_worker_0_fails_within_the_timeout(tmp_path):
  first, second = processes.free_loopback_ports(2)
  out = tmp_path / "runs.jsonl"
  tf_config = {"cluster": {"worker": [f"127.0.0.1:{first}", f"127.0.0.1:{second}"]},
               "task": {"type": "worker", "index": 0}}
  proc = _process_0_of_2({"TF_CONFIG": json.dumps(tf_config)},
                         ["--system=tf2", "--strategy=multi_worker"], out)
  _times_out(proc, out, f"devices: UsageError: worker 1 (127.0.0.1:{second}, "
                        "/job:worker/replica:0/task:1) did not answer within "
                        "--cluster_timeout_s=1")
