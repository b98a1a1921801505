"""Bad input: one clear error line naming the value, a non-zero exit, nothing lost."""

import json

import pytest

from tf_tput.records import results

from cli_helpers import error_lines, run_cli

TINY = "--gin_file=gin/models/t5_tiny.gin"


def _fails(tmp_path, *args, expect: str):
  out = tmp_path / "runs.jsonl"
  proc = run_cli("tf_tput.train", *args, f"--results={out}")
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert lines == error_lines(proc.stderr) and len(lines) == 1, proc.stderr
  assert expect in lines[0], lines[0]
  assert not out.exists() or not out.read_text()  # nothing ran, nothing written


@pytest.mark.parametrize("args, expect", [
    ((TINY, "--gin_param=ModelConfig.d_modle = 3"), "d_modle"),
    (("--gin_file=gin/models/t5_nope.gin",), "t5_nope.gin"),
    ((TINY, "--gin_file=gin/mesh/data2_model2.gin", "--num_cpu_devices=2"),
     "--num_cpu_devices=4"),
    ((TINY, "--gin_file=gin/mesh/data4.gin", "--num_cpu_devices=4", "--global_batch=6"),
     "batch = 6 is not divisible by mesh axis 'batch' of size 4"),
    ((TINY, "--gin_file=gin/mesh/model4.gin", "--num_cpu_devices=4",
      "--gin_param=ModelConfig.num_heads = 6"), "heads = 6 is not divisible"),
    ((TINY, "--gin_file=gin/mesh/model4.gin", "--num_cpu_devices=4",
      "--gin_param=ModelConfig.d_ff = 258"), "d_ff = 258 is not divisible"),
    ((TINY, "--gin_param=MeshConfig.mesh_shape = 'model:3'", "--num_cpu_devices=3",
      "--gin_param=ModelConfig.num_heads = 6", "--gin_param=ModelConfig.d_ff = 258"),
     "vocab = 512 is not divisible by mesh axis 'model' of size 3"),
    ((TINY, "--steps=0"), "TrainConfig.steps (--steps) = 0"),
    ((TINY, "--warmup_steps=0"), "TrainConfig.warmup_steps (--warmup_steps) = 0"),
    ((TINY, "--system=pathways"), "--system=pathways"),
    ((TINY, "--log_every=0"), "--log_every=0"),
    ((TINY, "--gin_param=ModelConfig.d_model = ("), "ModelConfig.d_model = ("),
    ((TINY, "--gin_param=MeshConfig.layout = 'd_ff:model;d_ff:batch'"),
     "maps 'd_ff' twice"),
    (("--steps=3",), "no --gin_file given"),
    ((TINY, "--strategy=multi_worker", "--system=jax"),
     "--strategy=multi_worker is not one --system=jax runs under; it runs under local"),
    ((TINY, "--strategy=multi_worker", "--num_cpu_devices=2"),
     "--num_cpu_devices applies to --strategy=local"),
    ((TINY, "--strategy=multi_worker", "--cluster_timeout_s=0"),
     "--cluster_timeout_s=0.0; it must be > 0"),
    ((TINY, "--tpu=my-tpu"), "--tpu applies to --strategy=tpu, not --strategy=local"),
    ((TINY, "--strategy=tpu", "--gin_param=ModelConfig.activation_dtype='bfloat16'"),
     "--strategy=tpu needs --tpu"),
    ((TINY, "--strategy=tpu", "--tpu=grpc://10.0.0.2:8470"),
     "--strategy=tpu trains in bfloat16 activations"),
    ((TINY, "--gin_param=ModelConfig.embedding = 'gather'"),
     "--system=mtf computes only one_hot"),
    ((TINY, "--tpu_type=v9"), "--tpu_type=v9 is not a TPU generation"),
    ((TINY, "--tpu_type=v3"), "--tpu_type applies to TPUs"),
], ids=["unknown-binding", "unknown-gin-file", "mesh-vs-devices", "batch-divisibility",
        "heads-divisibility", "d_ff-divisibility", "vocab-divisibility", "steps-zero",
        "warmup-zero", "unknown-system", "log-every-zero", "gin-syntax",
        "layout-twice", "no-model", "strategy-for-jax", "cpu-devices-in-a-cluster",
        "cluster-timeout-zero", "tpu-flag-locally", "tpu-without-address", "tpu-float32",
        "gather-on-mtf", "tpu-type-unknown", "tpu-type-on-cpu-mtf"])
def test_bad_request_fails_fast_with_one_line(tmp_path, args, expect):
  _fails(tmp_path, *args, expect=expect)


def test_unwritable_results_path(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  for path in (blocker / "runs.jsonl", tmp_path):  # parent is a file; a directory
    proc = run_cli("tf_tput.train", TINY, f"--results={path}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert error_lines(proc.stderr) == [proc.stderr.strip()]
    assert f"--results={path}" in proc.stderr


def test_unwritable_tensorboard_dir(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  _fails(tmp_path, TINY, f"--tensorboard_dir={blocker / 'tb'}",
         expect=f"--tensorboard_dir={blocker / 'tb'} is not a writable directory")


def test_malformed_results_line_is_kept_and_reported(tmp_path):
  out = tmp_path / "runs.jsonl"
  earlier = ['{"schema": "tf_tput.result/1", "note": "not a whole record"}',
             "this line was damaged"]
  out.write_text("\n".join(earlier) + "\n")
  proc = run_cli("tf_tput.train", TINY, "--steps=1", "--warmup_steps=1",
                 f"--results={out}")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  errors = error_lines(proc.stderr)
  assert len(errors) == 1 and "line(s) 1, 2 are not records" in errors[0], proc.stderr
  lines = out.read_text().splitlines()
  assert lines[:2] == earlier and len(lines) == 3
  new = json.loads(lines[2])
  results.validate(new)
  assert new["status"] == "ok"
