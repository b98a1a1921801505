"""--system=torch end to end: one process, two launched processes training the same
global batch (one record, process 0's, with the one-process run's losses), and
tf_tput.parity against mtf and jax."""

import json
import math
import sys

import pytest

from tf_tput import config, models
from tf_tput.records import provenance, results

from cli_helpers import run_cli

pytest.importorskip("torch")
from tf_tput.systems.torch import gemm as torch_gemm  # imports torch
pytestmark = pytest.mark.usefixtures("no_leftover_processes")

# The launchers' plumbing on the quickest model: decoder_tiny at 16 positions.
TINY = ["decoder_tiny"]
TINY_PARAMS = ["DataConfig.targets_length = 16"]
TRAIN = ("tf_tput.train", "--system=torch", *(f"--gin_file={f}" for f in TINY),
         *(f"--gin_param={p}" for p in TINY_PARAMS), "--steps=2", "--warmup_steps=1")


def _records(path) -> list:
  records = [json.loads(line) for line in path.read_text().splitlines()]
  for record in records:
    results.validate(record)
  return records


# One launch for every check of launched processes (tests/conftest.py: the
# coordinator's port).
@pytest.mark.loopback_ports
def test_two_launched_processes_train_the_one_process_run_s_losses(tmp_path, monkeypatch):
  monkeypatch.delenv(torch_gemm.PATH_ENV)  # tests/conftest.py's choice: --gemm's here
  one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
  # oneDNN's GEMM path, forced (tf_tput/measure/gemm.py): every process takes it.
  proc = run_cli(*TRAIN, "--gemm=onednn", f"--results={one}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = run_cli("tf_tput.launch", "--num_processes=2", "--", sys.executable, "-m",
                 *TRAIN, "--gemm=onednn", "--gin_file=data2", f"--results={two}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  [alone], [launched] = _records(one), _records(two)  # only process 0 appends
  expected = config.load_experiment(TINY, TINY_PARAMS)
  # The whole global batch, of targets alone (a decoder has no inputs).
  tokens_per_step = expected.train.global_batch * models.tokens_per_example(
      expected.model, expected.data.inputs_length, expected.data.targets_length)
  assert tokens_per_step == 8 * 16
  for record in (alone, launched):
    assert record["system"] == "torch" and record["status"] == "ok", record["error"]
    assert record["num_params"] == models.num_params(expected.model)
    assert record["tokens_per_step"] == tokens_per_step
    assert record["env"]["torch"]
    assert record["compilation_cache"] is None  # eager: nothing asked torch.compile's
    assert record["env"]["gemm"] == {"path": "onednn", "chosen_by": "--gemm",
                                     "probed_gflops": {}}
    assert all(isinstance(x, float) and math.isfinite(x) for x in record["losses"])
  assert (alone["num_processes"], alone["num_devices"], alone["strategy"]) == (
      1, 1, "local")
  assert (launched["num_processes"], launched["num_devices"], launched["strategy"]) == (
      2, 2, "multi_process")
  assert launched["mesh_shape"] == "batch:2"
  for record in (alone, launched):  # the two processes ran on this one machine
    assert record["nodes"] == [provenance.this_node()] and record["num_nodes"] == 1
  assert alone["peak_source"].startswith("measured: torch 2048x2048 float32")
  # Each process trains half the rows; the summed gradients and losses are the
  # whole batch's, so both runs take the same steps (up to the sum's rounding).
  assert len(alone["losses"]) == len(launched["losses"]) == 3
  assert launched["losses"] == pytest.approx(alone["losses"], rel=1e-5)
  assert alone["losses"][-1] < alone["losses"][0]


# Parity with mtf and jax through tf_tput.parity is in the run that also compares tf2
# (tests/integration/test_tf2_strategy.py): one TF start and one mtf build for both.


def test_model_axis_is_one_line_naming_mtf_and_jax(tmp_path):
  proc = run_cli(*TRAIN, "--gin_file=model4", "--num_cpu_devices=4",
                 f"--results={tmp_path / 'runs.jsonl'}")
  assert proc.returncode == 2
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "--system=mtf or --system=jax" in errors[0], proc.stderr
