"""Bad input: one clear error line naming the value, a non-zero exit, nothing lost."""

import time

import pytest

from cli_helpers import error_lines, run_cli

TINY = "--gin_file=gin/models/decoder_tiny.gin"


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
    ((TINY, "--system=pax"), "--system=pax is not a system"),
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
    ((TINY, "--cluster_timeout_s=nan"), "--cluster_timeout_s=nan; it must be > 0"),
    ((TINY, "--step_timeout_s=0"), "--step_timeout_s=0.0; it must be > 0"),
    ((TINY, "--step_timeout_s=-5"), "--step_timeout_s=-5.0; it must be > 0"),
    ((TINY, "--gemm=blis"), "--gemm=blis: tf offers "),
], ids=["unknown-binding", "unknown-gin-file", "mesh-vs-devices", "batch-divisibility",
        "heads-divisibility", "d_ff-divisibility", "vocab-divisibility", "steps-zero",
        "warmup-zero", "unknown-system", "log-every-zero", "gin-syntax",
        "layout-twice", "no-model", "strategy-for-jax", "cpu-devices-in-a-cluster",
        "cluster-timeout-zero", "tpu-flag-locally", "tpu-without-address", "tpu-float32",
        "gather-on-mtf", "tpu-type-unknown", "tpu-type-on-cpu-mtf",
        "cluster-timeout-nan", "step-timeout-zero", "step-timeout-negative",
        "gemm-unknown"])
def test_bad_request_fails_fast_with_one_line(tmp_path, args, expect):
  _fails(tmp_path, *args, expect=expect)


# A value of the wrong type or out of range, one per kind of field (every field of
# every config: tests/unit/test_bad_config_values.py), and batches the host cannot
# hold: refused in one line, exit 2, before any framework starts.
@pytest.mark.parametrize("args, expect", [
    ((TINY, "--gin_param=TrainConfig.seed = 'abc'"),
     "TrainConfig.seed = 'abc'; it must be an integer >= 0"),
    ((TINY, "--gin_param=DataConfig.pack = 1"), "DataConfig.pack = 1; it must be True"),
    ((TINY, "--gin_param=MeshConfig.mesh_shape = 5"), "MeshConfig.mesh_shape = 5; it must"),
    ((TINY, "--gin_param=ModelConfig.arch = None"), "ModelConfig.arch = None; choose one"),
    ((TINY, "--steps=abc"), "error: flag --steps=abc: invalid literal for int()"),
    (("--gin_file=t5_small", "--global_batch=1000000000"),
     "TrainConfig.global_batch (--global_batch) = 1000000000: its batches need"),
], ids=["seed-text", "pack-int", "mesh-shape-int", "arch-none", "steps-flag-text",
        "batch-past-host-memory"])
def test_bad_values_are_one_line_within_seconds(tmp_path, args, expect):
  start = time.monotonic()
  _fails(tmp_path, *args, expect=expect)
  assert time.monotonic() - start < 10  # ~0.4 s: nothing but the check runs


def test_a_results_path_ending_in_a_separator_is_refused(tmp_path):
  path = f"{tmp_path / 'newdir'}/"
  proc = run_cli("tf_tput.train", TINY, f"--results={path}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert error_lines(proc.stderr) == [proc.stderr.strip()]
  assert f"--results={path} is a directory; name a file such as" in proc.stderr
  assert not (tmp_path / "newdir").exists() or not any((tmp_path / "newdir").iterdir())


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


# A results file with lines that are not records: a real run appends after them and
# says so; checked beside the bfloat16 run in tests/e2e/test_train_cli.py.


@pytest.mark.parametrize("files, expect", [
    ({"loop.gin": "include '{d}/loop.gin'\n"},
     "include cycle: {d}/loop.gin includes {d}/loop.gin;"),
    ({"loop.gin": "include '{d}/other.gin'\n", "other.gin": "include '{d}/loop.gin'\n"},
     "include cycle: {d}/loop.gin includes {d}/other.gin includes {d}/loop.gin;"),
    ({"loop.gin": "include 'gin/models/t5_common.gin'\ninclude 'gin/models/t5_gone.gin'\n"},
     "{d}/loop.gin includes 'gin/models/t5_gone.gin', which is not found"),
], ids=["includes-itself", "include-each-other", "includes-a-missing-file"])
def test_an_include_cycle_or_missing_include_is_one_line_and_exit_2(tmp_path, files,
                                                                    expect):
  """Before any framework starts: gin alone would recurse until a RecursionError."""
  for name, text in files.items():
    (tmp_path / name).write_text(text.format(d=tmp_path))
  out = tmp_path / "runs.jsonl"
  started = time.monotonic()
  proc = run_cli("tf_tput.train", f"--gin_file={tmp_path / 'loop.gin'}",
                 f"--results={out}")
  assert proc.returncode == 2 and time.monotonic() - started < 30
  [line] = [line for line in proc.stderr.splitlines() if line.strip()]
  assert line.startswith("error: gin: ") and expect.format(d=tmp_path) in line, line
  assert not out.exists()
