"""tf_tput.train end to end: tiny models on a 2x2 mesh of 4 virtual CPU devices."""

import json
import math
import statistics

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from tf_tput import config, models
from tf_tput.records import provenance, results
from tf_tput.systems.tensorflow import runtime as tf_runtime

from cli_helpers import REPO, error_lines, run_cli

MESH_2X2 = "gin/mesh/data2_model2.gin"


def _train(tmp_path, model: str, *extra: str, cwd=REPO):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.train", f"--gin_file=gin/models/{model}.gin",
                 f"--gin_file={MESH_2X2}", "--system=mtf", "--num_cpu_devices=4",
                 "--steps=10", "--warmup_steps=2", f"--results={out}", *extra, cwd=cwd)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = out.read_text().splitlines()
  assert len(lines) == 1
  record = json.loads(lines[0])
  results.validate(record)
  return record, proc


def _check_trained(record, model: str, tokens_per_step: int):
  expected = config.load_experiment([f"gin/models/{model}.gin", MESH_2X2])
  assert record["status"] == "ok" and record["error"] is None
  assert record["system"] == "mtf" and record["model"] == model
  assert record["mesh_shape"] == "batch:2;model:2" and record["num_devices"] == 4
  assert record["nodes"] == [provenance.this_node()] and record["num_nodes"] == 1
  assert record["num_params"] == models.num_params(expected.model)
  assert len(record["losses"]) == 12 and record["final_loss"] == record["losses"][-1]
  # The loss falls: synthetic tokens follow a skewed unigram distribution to learn.
  assert statistics.mean(record["losses"][-3:]) < statistics.mean(record["losses"][:3]) - 0.3
  assert record["tokens_per_step"] == record["padded_tokens_per_step"] == tokens_per_step
  assert record["tokens_per_sec"] > 0
  assert 0 < record["mfu"] < 1
  assert record["peak_source"].startswith("measured: tf 2048x2048 float32")
  assert record["model_flops_per_token"] == models.model_flops_per_token(
      expected.model, 128, 128)
  st = record["step_time_s"]
  assert st["min"] <= st["p10"] <= st["median"] <= st["p90"] <= st["max"]
  # Tokens/s is the measured tokens over the measured wall time, not 1 / median step.
  assert abs(record["tokens_per_sec"] - tokens_per_step / st["mean"]) < 1e-6 * record["tokens_per_sec"]
  assert "ModelConfig.d_model" in record["config"]
  # Startup, apart from the steps: the first step is inside the warmup; mtf compiles
  # inside its first step and keeps no persistent compilation cache.
  assert record["build_s"] > 0 and record["first_step_s"] > 0
  assert record["warmup_s"] >= record["first_step_s"]
  assert record["compile_s"] is None and record["compilation_cache"] is None
  assert record["env"]["tensorflow"] and record["env"]["mesh_tensorflow"] == "0.1.21"
  # TF's GEMM path (tf_tput/measure/gemm.py), with no TF_ENABLE_ONEDNN_OPTS set: the
  # faster probe of Eigen and oneDNN.
  gemm = record["env"]["gemm"]
  assert gemm["chosen_by"] == "the fastest probe"
  probed = gemm["probed_gflops"]
  assert set(probed) == {"eigen", "onednn"}
  assert probed[gemm["path"]] == max(probed.values())


# One run for TensorBoard, the trace and another working directory (each run builds
# and lowers an mtf graph). A decoder's record: tests/e2e/test_tf_cluster.py.
def test_t5_tiny_trains_on_2x2_mesh_from_another_directory_with_tensorboard_and_traces(
    tmp_path, monkeypatch):
  monkeypatch.delenv(tf_runtime.ONEDNN_ENV)  # TF's GEMM path by its probes, as users run
  tb_dir = tmp_path / "tb"
  record, proc = _train(tmp_path, "t5_tiny", f"--tensorboard_dir={tb_dir}",
                        f"--trace_dir={tmp_path / 'trace'}", cwd=tmp_path)
  _check_trained(record, "t5_tiny", tokens_per_step=8 * (128 + 128))
  assert record["arch"] == "encoder_decoder" and record["inputs_length"] == 128
  assert "tokens/s" in proc.stdout and "record appended" in proc.stdout
  assert "startup: build " in proc.stdout
  tags = {(event.step, value.tag)
          for path in tb_dir.iterdir() for event in EventFileLoader(str(path)).Load()
          for value in event.summary.value}
  assert (0, "loss") in tags and (11, "tokens_per_sec") in tags
  # --trace_dir: one more step, not part of the run (12 losses are checked above).
  [trace] = (tmp_path / "trace").iterdir()
  assert trace.name == f"{record['run_id']}.trace.json"
  events = json.loads(trace.read_text())["traceEvents"]
  assert any(e.get("ph") == "X" and e.get("dur", 0) > 0 for e in events)
  rows = [line for line in proc.stdout.splitlines()
          if line.startswith("/job:localhost/replica:0/task:0/device:CPU:")]
  assert len(rows) == 4, proc.stdout
  assert all(float(row.split()[2]) > 0 for row in rows)  # compute op-seconds per device


# The same run appends after lines that are not records: they are kept, and reported
# in one error line with exit code 1 (one run for both checks).
def test_bfloat16_activations_on_one_device_after_malformed_results_lines(tmp_path):
  out = tmp_path / "runs.jsonl"
  earlier = ['{"schema": "tf_tput.result/1", "note": "not a whole record"}',
             "this line was damaged"]
  out.write_text("\n".join(earlier) + "\n")
  # A decoder: an encoder-decoder's graph (t5_tiny) costs twice the CPU to build, and
  # the T5 record is the run above's.
  proc = run_cli("tf_tput.train", "--gin_file=gin/models/decoder_tiny.gin",
                 "--gin_param=ModelConfig.activation_dtype = 'bfloat16'",
                 "--gin_param=ModelConfig.num_layers = 1",
                 "--steps=3", "--warmup_steps=1", f"--results={out}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and "line(s) 1, 2 are not records" in errors[0], proc.stderr
  lines = out.read_text().splitlines()
  assert lines[:2] == earlier and len(lines) == 3
  record = json.loads(lines[2])
  results.validate(record)
  assert record["status"] == "ok"
  assert record["dtype"] == "bfloat16" and record["num_devices"] == 1
  assert "bfloat16 matmul" in record["peak_source"]
  assert all(isinstance(loss, float) and math.isfinite(loss) for loss in record["losses"])
