"""Pipelines end to end: the two systems' pipelines train the same function as each
other (tf_tput.parity), and a pipelined run's record. Each pipeline against its own
system unpipelined, on this configuration: tests/integration/test_mtf_pipeline.py
and tests/unit/test_jax_pipeline.py."""

import json
import re

import pytest

from tf_tput.records import results

from cli_helpers import error_lines, run_cli

# decoder_tiny on 4 virtual CPU devices: 2 stages of 'batch:2', 4 micro-batches of 2.
PIPELINE_2 = ["--gin_file=gin/models/decoder_tiny.gin", "--mesh=batch:2",
              "--gin_param=PipelineConfig.stages = 2",
              "--gin_param=PipelineConfig.micro_batches = 4",
              "--gin_param=DataConfig.targets_length = 32"]


def test_both_pipelines_match_each_other():
  proc = run_cli("tf_tput.parity", *PIPELINE_2, "--steps=10", "--systems=mtf,jax",
                 timeout=900)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*\d+\s", line)]
  assert len(rows) == 10 and all(len(row) == 1 + 2 + 1 for row in rows)
  mtf_vs_jax = [float(row[3]) for row in rows]  # the two pipelines, rel from mtf
  assert mtf_vs_jax[0] < 1e-5 and max(mtf_vs_jax) < 1e-3
  assert "2 stages x 4 micro-batches" in proc.stdout


@pytest.mark.parametrize("system", ["mtf", "jax"])
def test_a_pipelined_run_records_its_schedule(system, tmp_path):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.train", f"--system={system}", *PIPELINE_2[:1],
                 *PIPELINE_2[2:], "--gin_param=MeshConfig.mesh_shape = 'batch:2'",
                 "--num_cpu_devices=4", "--steps=2", "--warmup_steps=1",
                 f"--results={out}", timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = json.loads(out.read_text())
  results.validate(record)
  assert (record["pipeline_stages"], record["micro_batches"], record["schedule"]) == (
      2, 4, "gpipe")
  assert record["bubble_fraction"] == pytest.approx(1 / 5)
  assert record["num_devices"] == 4 and record["tokens_per_step"] == 8 * 32
  assert record["tokens_per_sec"] > 0 and record["status"] == "ok"


def test_a_bad_pipeline_is_one_line_before_any_framework(tmp_path):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.train", "--system=mtf", *PIPELINE_2[:1], *PIPELINE_2[2:],
                 "--gin_param=PipelineConfig.micro_batches = 3", "--num_cpu_devices=4",
                 f"--results={out}", timeout=60)
  assert proc.returncode == 2 and not out.exists()
  assert error_lines(proc.stderr) == [
      "error: TrainConfig.global_batch = 8 is not divisible by "
      "PipelineConfig.micro_batches = 3; choose a multiple of 3"]
