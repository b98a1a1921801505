"""--system=jax end to end: launched processes on one mesh, and parity with mtf."""

import json
import math
import re
import statistics
import sys

import pytest

from tf_tput import config, models
from tf_tput.records import results

from cli_helpers import run_cli

MESH_2X2 = "gin/mesh/data2_model2.gin"
# Launched processes' plumbing: decoder_tiny at 16 positions, the quickest program.
TINY = ["gin/models/decoder_tiny.gin", MESH_2X2]
TINY_PARAMS = ["DataConfig.targets_length = 16"]


def _record(path):
  lines = path.read_text().splitlines()
  assert len(lines) == 1  # launched processes: only process 0 writes
  record = json.loads(lines[0])
  results.validate(record)
  return record


# One launch checks the three: a decoder_tiny run on a 2x2 mesh (single-process jax
# runs on 4 devices: tf_tput.parity below, tests/e2e/test_pipeline_cli.py), two
# launched processes sharing that mesh, and sync_every. Each run compiles for 4 devices.
@pytest.mark.loopback_ports  # the launcher's coordinator port (tests/conftest.py)
def test_decoder_tiny_trains_on_2x2_mesh_in_two_launched_processes_with_sync_every_2(
    tmp_path):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.launch", "--num_processes=2", "--", sys.executable, "-m",
                 "tf_tput.train", "--system=jax", *(f"--gin_file={f}" for f in TINY),
                 *(f"--gin_param={p}" for p in TINY_PARAMS), "--num_cpu_devices=2",
                 "--gin_param=TrainConfig.sync_every=2", "--steps=4", "--warmup_steps=2",
                 f"--results={out}", f"--compilation_cache_dir={tmp_path / 'cache'}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  record = _record(out)
  expected = config.load_experiment(TINY, TINY_PARAMS)
  assert record["system"] == "jax" and record["status"] == "ok"
  assert record["num_processes"] == 2 and record["num_devices"] == 4
  assert record["strategy"] == "multi_process"
  assert record["num_params"] == models.num_params(expected.model)
  # The whole global batch, of targets alone (a decoder has no inputs).
  assert record["tokens_per_step"] == expected.train.global_batch * models.tokens_per_example(
      expected.model, expected.data.inputs_length, expected.data.targets_length) == 8 * 16
  assert all(isinstance(loss, float) and math.isfinite(loss) for loss in record["losses"])
  assert statistics.mean(record["losses"][-3:]) < statistics.mean(record["losses"][:3]) - 0.3
  # Process 0 probed the peak between two barriers; its record holds the measured one.
  assert record["peak_source"].startswith("measured: jax 2048x2048 float32")
  assert record["peak_flops_per_device"] > 0 and record["mfu"] > 0
  assert record["env"]["jax"]
  assert record["sync_every"] == 2 and record["synchronous_step"] is False
  assert len(record["losses"]) == 6  # every step's loss, fetched two at a time
  # Two windows, each step given half its window: four durations in two equal pairs,
  # so their mean is their median (four arbitrary durations would not be).
  st = record["step_time_s"]
  assert st["mean"] == pytest.approx(st["median"], rel=1e-9)
  # Both processes compiled into one new cache directory at once.
  assert record["compilation_cache"] == "miss"
  assert 0 < record["compile_s"] <= record["first_step_s"] <= record["warmup_s"]


# On one device the same parity is asserted in-process (tests/unit/test_jax_model.py);
# here the entry point on a sharded mesh, where the layouts must agree too. The
# decoder is compared on 4 devices by tests/e2e/test_pipeline_cli.py.
@pytest.mark.parametrize("model", ["t5_tiny"])
@pytest.mark.parametrize("mesh", [[f"--mesh={MESH_2X2}"]], ids=["2x2"])
def test_parity_with_mtf_float32(model, mesh):
  proc = run_cli("tf_tput.parity", f"--gin_file=gin/models/{model}.gin", *mesh,
                 "--steps=10")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*\d+\s", line)]
  assert len(rows) == 10
  rel = [float(row[3]) for row in rows]
  assert rel[0] < 1e-5 and max(rel) < 1e-3


def test_a_second_run_of_the_same_program_loads_it_from_the_compilation_cache(tmp_path):
  """Two runs of one config share a cache directory: the first compiles (miss), the
  second loads every executable (hit). A changed program misses: in-process in
  tests/unit/test_jax_compilation_cache.py."""
  out, cache = tmp_path / "runs.jsonl", tmp_path / "cache"
  for _ in range(2):
    proc = run_cli("tf_tput.train", "--system=jax", "--gin_file=decoder_tiny",
                   "--gin_param=ModelConfig.num_layers=1",  # plumbing: one layer
                   "--gin_param=DataConfig.targets_length=32",
                   "--steps=1", "--warmup_steps=1", f"--results={out}",
                   f"--compilation_cache_dir={cache}")
    assert proc.returncode == 0, proc.stderr[-3000:]
  cold, warm = (json.loads(line) for line in out.read_text().splitlines())
  assert (cold["compilation_cache"], warm["compilation_cache"]) == ("miss", "hit")
  for record in (cold, warm):
    assert record["build_s"] > 0
    assert 0 < record["compile_s"] <= record["first_step_s"] <= record["warmup_s"]
  assert "compilation cache hit" in proc.stdout
