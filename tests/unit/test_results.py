"""tf_tput/records/results.py: the record schema, atomic append, tolerant reading."""

import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest

from tf_tput import REPO_ROOT
from tf_tput.records import results
from tf_tput.errors import UsageError

from record_fixtures import micro_record


def valid_record(**overrides) -> dict:
  record = {
      "schema": results.SCHEMA, "run_id": "r1", "started_at": "2024-01-01T00:00:00Z",
      "status": "ok", "error": None, "system": "mtf", "strategy": "spmd",
      "model": "t5_tiny", "arch": "encoder_decoder", "num_params": 263168,
      "mesh_shape": "batch:2;model:2", "layout": "batch:batch;d_ff:model",
      "num_devices": 4, "num_processes": 1, "launcher": "slurm", "job_id": "41",
      "array_job_id": "40", "array_task_id": 1, "concurrent_runs": [], "packed": False,
      "nodes": ["test-host/10.0.0.1"],
      "num_nodes": 1, "global_batch": 8, "inputs_length": 16,
      "targets_length": 16, "dtype": "float32", "embedding": "one_hot",
      "variant": "TorchOptions.compile=True", "caveat": None, "pipeline_stages": 1,
      "micro_batches": 1, "schedule": None, "bubble_fraction": 0.0, "islands": 0,
      "devices_per_island": 4, "dcn_rate": None, "link_bytes_per_step": None,
      "link_bytes_per_step_analytic": None, "steps": 4,
      "warmup_steps": 2, "sync_every": 1, "synchronous_step": True,
      "build_s": 3.0, "compile_s": 1.0, "first_step_s": 1.5, "warmup_s": 2.0,
      "compilation_cache": "miss",
      "step_time_s": {k: 0.5 for k in results.STEP_TIME_KEYS},
      "tokens_per_step": 256, "padded_tokens_per_step": 256, "tokens_per_sec": 512.0,
      "padded_tokens_per_sec": 512.0, "model_flops_per_token": 1.5e6,
      "model_tflops_per_sec": 0.00077, "peak_flops_per_device": None,
      "peak_source": "none: test", "mfu": None, "peak_host_memory_bytes": 1 << 30,
      "device_memory_bytes": None, "steps_measured": 4,
      "window_s": [0.5] * 4, "signal": None, "losses": [6.0, 5.5, 5.0, 4.5, 4.0, 3.5],
      "final_loss": 3.5, "config": "ModelConfig.name = 't5_tiny'",
      "flags": {"steps": 4}, "env": {k: "x" for k in results.ENV_KEYS},
      "git_commit": None, "run_key": "0123456789abcdef",
  }
  assert set(record) == set(results.FIELDS)  # the helper covers the whole schema
  record.update(overrides)
  return record


def test_validate_accepts_valid_record():
  results.validate(valid_record())
  results.validate(valid_record(status="failed", error="step 3: boom",
                                tokens_per_sec=None, final_loss=None))


def test_validate_missing_field():
  record = valid_record()
  del record["num_params"]
  with pytest.raises(ValueError, match="num_params"):
    results.validate(record)


@pytest.mark.parametrize("field,value", [
    ("num_params", "263168"),
    ("num_params", 263168.0),
    ("num_devices", True),        # a bool is not an int here
    ("losses", (1.0, 2.0)),
    ("tokens_per_sec", "fast"),
    ("error", 3),
])
def test_validate_wrong_type(field, value):
  with pytest.raises(ValueError, match=field):
    results.validate(valid_record(**{field: value}))


def test_validate_failed_without_error():
  with pytest.raises(ValueError, match="error"):
    results.validate(valid_record(status="failed", error=None))


def test_validate_unknown_field():
  with pytest.raises(ValueError, match="tokens_per_second"):
    results.validate(valid_record(tokens_per_second=1.0))


@pytest.mark.parametrize("overrides,needle", [
    ({"schema": "tf_tput.result/0"}, "schema"),
    ({"status": "done"}, "status"),
    ({"step_time_s": {"median": 1.0}}, "step_time_s"),
    ({"env": {"python": "3.11"}}, "env lacks"),
    ({"final_loss": None}, "final_loss"),
])
def test_validate_other_problems(overrides, needle):
  with pytest.raises(ValueError, match=needle):
    results.validate(valid_record(**overrides))


def test_append_one_line_per_record(tmp_path):
  path = str(tmp_path / "runs.jsonl")
  assert results.append(path, valid_record(run_id="a")) == 1
  assert results.append(path, valid_record(run_id="b")) == 2
  assert results.append(path, valid_record(run_id="c")) == 3
  lines = (tmp_path / "runs.jsonl").read_bytes().split(b"\n")
  assert lines[-1] == b""
  assert [json.loads(line)["run_id"] for line in lines[:-1]] == ["a", "b", "c"]
  # Field order follows the record (FIELDS order here).
  assert list(json.loads(lines[0])) == list(results.FIELDS)


def test_append_rejects_invalid_record_and_writes_nothing(tmp_path):
  path = tmp_path / "runs.jsonl"
  with pytest.raises(ValueError):
    results.append(str(path), valid_record(status="bogus"))
  assert not path.exists() or path.read_bytes() == b""


def test_append_after_truncated_line(tmp_path):
  path = tmp_path / "runs.jsonl"
  results.append(str(path), valid_record(run_id="first"))
  with open(path, "ab") as f:
    f.write(b'{"trunc')           # a crash left a line without its newline
  assert results.append(str(path), valid_record(run_id="second")) == 3
  lines = path.read_bytes().split(b"\n")
  assert lines[1] == b'{"trunc'  # kept intact, closed with a newline
  assert json.loads(lines[2])["run_id"] == "second"
  records, problems = results.read(str(path))
  assert [r["run_id"] for r in records] == ["first", "second"]
  assert [n for n, _ in problems] == [2]


def test_append_to_file_with_only_a_truncated_line(tmp_path):
  path = tmp_path / "runs.jsonl"
  path.write_bytes(b'{"trunc')
  assert results.append(str(path), valid_record()) == 2
  assert path.read_bytes().startswith(b'{"trunc\n{')


# Appends one record under a file size limit of `limit` bytes (RLIMIT_FSIZE, a real
# failure of the write; Python ignores SIGXFSZ, so the write is cut short, then fails
# with EFBIG); prints the error, or "appended".
LIMITED_APPEND = r"""
import json, resource, sys
from tf_tput.records import results
path, limit, record = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
  results.append(path, record)
  print("appended")
except OSError as e:
  print(f"{type(e).__name__}: {e}")
"""


@pytest.mark.parametrize("before", [b"", b'{"a": "whole line"}\n', b'{"trunc'])
def test_an_append_cut_short_leaves_the_file_as_it_was(tmp_path, before):
  path = tmp_path / "runs.jsonl"
  path.write_bytes(before)
  record = valid_record()
  done = subprocess.run([sys.executable, "-c", LIMITED_APPEND, str(path),
                         str(len(before) + 100), json.dumps(record)],
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("OSError: [Errno 27] File too large"), done.stdout
  assert path.read_bytes() == before
  # The same append without the limit writes the whole line.
  results.append(str(path), record)
  assert results.read(str(path))[0] == [record]


def test_a_record_kept_aside_is_whole(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  side = results.keep_aside(valid_record(run_id="aside"))
  assert side.startswith(str(tmp_path / "tf_tput-record-aside-"))
  assert results.read(side)[0] == [valid_record(run_id="aside")]


def test_read_records_and_problems(tmp_path):
  path = tmp_path / "runs.jsonl"
  good = json.dumps(valid_record(run_id="g"))
  partial = json.dumps({"schema": "tf_tput.micro/1", "run_id": "m"})
  path.write_text("\n".join([good, "not json", "", "[1, 2]", '{"no_schema": 1}',
                             partial]) + "\n")
  records, problems = results.read(str(path))
  assert [r["run_id"] for r in records] == ["g"]
  assert [n for n, _ in problems] == [2, 4, 5, 6]
  assert "not JSON" in problems[0][1]
  assert "schema" in problems[1][1]
  assert "not a valid tf_tput.micro/1 record (missing" in problems[3][1]
  # Filtering by schema keeps only matching records; problems are unchanged.
  records, problems2 = results.read(str(path), schema=results.SCHEMA)
  assert [r["run_id"] for r in records] == ["g"]
  assert problems2 == problems


def test_read_missing_file(tmp_path):
  assert results.read(str(tmp_path / "nope.jsonl")) == ([], [])


def test_check_appendable_directory(tmp_path):
  with pytest.raises(UsageError, match="directory"):
    results.check_appendable(str(tmp_path))


def test_check_appendable_parent_is_a_file(tmp_path):
  parent = tmp_path / "a_file"
  parent.write_text("x")
  target = parent / "runs.jsonl"
  with pytest.raises(UsageError) as info:
    results.check_appendable(str(target))
  assert str(target) in str(info.value)
  assert "\n" not in str(info.value)
  assert parent.read_text() == "x"


def test_check_appendable_creates_parents(tmp_path):
  target = tmp_path / "x" / "y" / "runs.jsonl"
  assert results.check_appendable(str(target)) == []
  assert target.parent.is_dir()
  assert not target.exists()  # proven writable, not left behind


def test_check_appendable_reports_malformed_lines(tmp_path):
  target = tmp_path / "runs.jsonl"
  target.write_text(json.dumps(valid_record()) + "\n" + "garbage\n")
  problems = results.check_appendable(str(target))
  assert [n for n, _ in problems] == [2]
  # Existing content is left untouched.
  assert target.read_text().endswith("garbage\n")


def test_append_writes_strict_json_for_a_diverged_run(tmp_path):
  path = tmp_path / "runs.jsonl"
  record = valid_record(status="failed", error="step 1: loss is nan",
                        losses=[3.0, float("nan")], final_loss=float("nan"),
                        tokens_per_sec=float("inf"))
  results.append(str(path), record)

  def reject(constant):
    raise ValueError(f"non-standard JSON constant {constant}")
  written = json.loads(path.read_text(), parse_constant=reject)
  assert written["losses"] == [3.0, None] and written["final_loss"] is None
  assert written["tokens_per_sec"] is None


@pytest.mark.parametrize("schema", sorted(results.LATER_FIELDS))
def test_later_fields_belong_to_their_schema(schema):
  assert set(results.LATER_FIELDS[schema]) <= set(results.fields_of(schema))


@pytest.mark.parametrize("schema", sorted(results.LATER_FIELDS))
def test_a_record_from_before_a_later_field_is_read_but_not_written(tmp_path, schema):
  old = (valid_record(run_id="old") if schema == results.SCHEMA
         else micro_record(matmul_n=64, computation_ms=1.0, computation_ms_measured=1.2,
                           run_id="old"))
  for field in results.LATER_FIELDS[schema]:
    del old[field]
  path = tmp_path / "runs.jsonl"
  path.write_text(json.dumps(old) + "\n")
  records, problems = results.read(str(path))
  assert [r["run_id"] for r in records] == ["old"] and problems == []
  first = results.LATER_FIELDS[schema][0]
  assert first not in records[0]  # absent, not guessed
  with pytest.raises(ValueError, match=f"missing {first}"):
    results.append(str(tmp_path / "new.jsonl"), old)
  assert not (tmp_path / "new.jsonl").exists()


def test_this_node_is_the_host_name_and_its_address(monkeypatch):
  from tf_tput.records import provenance
  monkeypatch.setattr(socket, "gethostname", lambda: "island-host")
  monkeypatch.setattr(socket, "gethostbyname",
                      {"island-host": "198.18.0.2"}.__getitem__)
  assert provenance.this_node() == "island-host/198.18.0.2"

  def unresolved(name):
    raise socket.gaierror(-2, "Name or service not known")
  monkeypatch.setattr(socket, "gethostbyname", unresolved)
  assert provenance.this_node() == "island-host"


def test_a_record_s_nodes_are_distinct_and_sorted_and_counted():
  from tf_tput.records import build
  assert build.node_fields(("h2/2", "h1/1", "h2/2")) == {"nodes": ["h1/1", "h2/2"],
                                                         "num_nodes": 2}
  assert build.node_fields(()) == {"nodes": [], "num_nodes": 0}  # never resolved


def test_native_bfloat16_is_read_from_the_cpu_flags():
  from tf_tput.records import provenance
  assert provenance.native_bfloat16({"avx2", "fma"}) == []
  assert provenance.native_bfloat16({"avx512f", "avx512_bf16", "amx_bf16"}) == [
      "amx_bf16", "avx512_bf16"]
  env = provenance.env([], {"jax": ("jax",), "nothing": ("no-such-distribution",)})
  assert "cpu_bfloat16" in env and env["nothing"] is None and env["jax"]
