"""Result records for report tests: valid by the schema, values chosen by the test."""

from tf_tput.records import results

ENV = {"python": "3.11.7", "tensorflow": "2.21.0", "mesh_tensorflow": "0.1.21",
       "jax": "0.10.2", "numpy": "2.4.6", "platform": "Linux-test", "cpu": "Test CPU",
       "cpu_count": 2, "accelerators": [{"platform": "cpu", "kind": "Test CPU", "count": 4}]}


def train_record(model="t5_tiny", system="mtf", tokens_per_sec=1000.0, status="ok",
                 step_s=(0.9, 1.0, 1.2), steps=10, run_id="r1", **overrides) -> dict:
  """A train record; step_s = (p10, median, p90) step seconds."""
  p10, median, p90 = step_s
  ok = status == "ok"
  record = {
      "schema": results.SCHEMA, "run_id": run_id, "started_at": "2026-12-02T10:00:00+00:00",
      "status": status, "error": None if ok else "step 3: boom", "system": system,
      "strategy": "local", "model": model, "arch": "encoder_decoder",
      "num_params": 263168, "mesh_shape": "batch:2;model:2",
      "layout": "batch:batch;d_ff:model;heads:model;vocab:model", "num_devices": 4,
      "num_processes": 1, "launcher": None, "job_id": None,
      "array_job_id": None, "array_task_id": None, "concurrent_runs": [], "packed": False,
      "nodes": ["test-host/10.0.0.1"], "num_nodes": 1,
      "global_batch": 8, "inputs_length": 128, "targets_length": 128,
      "dtype": "float32", "embedding": "one_hot",
      "variant": None, "caveat": None, "pipeline_stages": 1,
      "micro_batches": 1, "schedule": None, "bubble_fraction": 0.0, "islands": 0,
      "devices_per_island": 4, "dcn_rate": None, "link_bytes_per_step": None,
      "link_bytes_per_step_analytic": None, "steps": steps,
      "warmup_steps": 2,
      "sync_every": 1, "synchronous_step": True,
      "build_s": 3.0, "compile_s": None, "first_step_s": 1.5 if ok else None,
      "warmup_s": 2.0 if ok else None, "compilation_cache": None,
      "step_time_s": ({"median": median, "mean": median, "p10": p10, "p90": p90,
                       "min": p10 * 0.9, "max": p90 * 1.1} if ok else
                      {k: None for k in results.STEP_TIME_KEYS}),
      "tokens_per_step": 2048 if ok else None, "padded_tokens_per_step": 2048 if ok else None,
      "tokens_per_sec": tokens_per_sec if ok else None,
      "padded_tokens_per_sec": tokens_per_sec if ok else None,
      "model_flops_per_token": 1.5e6, "model_tflops_per_sec": 0.0015 if ok else None,
      "peak_flops_per_device": 1e11, "peak_source": "measured: test", "mfu": 0.25 if ok else None,
      "peak_host_memory_bytes": 1 << 30, "device_memory_bytes": None,
      "steps_measured": 1 if ok else 0, "window_s": [0.5] if ok else [], "signal": None,
      "losses": [6.0, 5.0] if ok else [], "final_loss": 5.0 if ok else None,
      "config": "ModelConfig.name = 'x'", "flags": {"system": system}, "env": ENV,
      "git_commit": "0123456789abcdef", "run_key": f"key-{run_id}",
  }
  record.update(overrides)
  results.validate(record)
  return record


def micro_record(system="tf", mode="opbyop", hosts=1, repeats=(900.0, 1000.0, 1100.0),
                 status="ok", run_id="m1", **overrides) -> dict:
  ok = status == "ok"
  record = {
      "schema": results.MICRO_SCHEMA, "run_id": run_id,
      "started_at": "2026-12-02T10:00:00+00:00", "status": status,
      "error": None if ok else f"{system} {mode}: {status}", "system": system, "mode": mode,
      "hosts": hosts, "devices_per_host": 2, "chain_length": 128, "computations": 1024,
      "matmul_n": 0, "computation_ms": None,
      "computation_ms_measured": None, "wall_s": 3.0 if ok else None,
      "computations_per_sec": sum(repeats) / len(repeats) if ok else None,
      "repeats": list(repeats) if ok else [], "env": ENV, "git_commit": "0123456789abcdef",
      "run_key": f"key-{run_id}",
  }
  record.update(overrides)
  results.validate(record)
  return record
