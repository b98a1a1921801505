"""Throughput arithmetic: step-time statistics, tokens/s, model FLOP/s, MFU, peaks.

Conventions (ARCHITECTURE.md, "Measurement conventions"): warmup steps are excluded;
tokens/s = tokens of measured steps / (completion of the last measured step -
completion of the last warmup step); MFU counts every position the model computes
(padding included) against the peak FLOP/s of all devices.
"""

import resource
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from tf_tput import models

# Dense peak FLOP/s per device as frameworks address it (a TPU v2/v3 core, a v4/v5
# chip, a GPU), from the vendors' published figures. float32 on NVIDIA Ampere and
# later is the TF32 tensor-core rate, which TensorFlow and JAX use for float32 matmuls
# by default. A missing entry gives no MFU rather than a guessed one.
PEAK_FLOPS = {
    ("tpu_v2", "bfloat16"): 22.5e12,
    ("tpu_v3", "bfloat16"): 61.5e12,
    ("tpu_v4", "bfloat16"): 275e12,
    ("tpu_v5e", "bfloat16"): 197e12,
    ("tpu_v5p", "bfloat16"): 459e12,
    ("a100", "bfloat16"): 312e12,
    ("a100", "float32"): 156e12,
    ("h100", "bfloat16"): 989.4e12,
    ("h100", "float32"): 494.7e12,
    ("h200", "bfloat16"): 989.4e12,
    ("h200", "float32"): 494.7e12,
}

# Device kinds whose name does not contain their table key.
DEVICE_KIND_ALIASES = {"tpuv5lite": "tpu_v5e"}

MATMUL_PEAK_SIZE = 2048  # n of the n x n x n matmul that measures a CPU's peak


def accelerator_key(device_kind: str) -> Optional[str]:
  """'NVIDIA H100 80GB HBM3' -> 'h100', 'TPU v3' -> 'tpu_v3'; None when unknown."""
  kind = device_kind.lower().replace(" ", "").replace("-", "")
  for alias, key in DEVICE_KIND_ALIASES.items():
    if alias in kind:
      return key
  for key in sorted({k for k, _ in PEAK_FLOPS}, key=len, reverse=True):
    if key.replace("_", "") in kind:
      return key
  return None


def table_peak(device_kind: str, dtype: str) -> tuple:
  """(peak FLOP/s per device or None, peak_source) from PEAK_FLOPS."""
  key = accelerator_key(device_kind)
  if key and (key, dtype) in PEAK_FLOPS:
    return PEAK_FLOPS[(key, dtype)], f"table:{key}:{dtype}"
  return None, f"none: no peak table entry for {device_kind!r} at {dtype}"


def measure_matmul_peak(run_matmul: Callable[[], None], n: int = MATMUL_PEAK_SIZE,
                        repeats: int = 10) -> float:
  """FLOP/s of the fastest of `repeats` n x n matmuls; run_matmul blocks until done."""
  run_matmul()  # first call compiles / allocates
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    run_matmul()
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best


def step_time_stats(durations: Sequence[float]) -> dict:
  d = np.asarray(durations, dtype=np.float64)
  if d.size == 0:
    return {k: None for k in ("median", "mean", "p10", "p90", "min", "max")}
  return {"median": float(np.median(d)), "mean": float(d.mean()),
          "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90)),
          "min": float(d.min()), "max": float(d.max())}


def peak_host_memory_bytes() -> int:
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def summarize(measurement, experiment, num_devices: int,
              peak_flops_per_device: Optional[float]) -> dict:
  """The throughput fields of a result record from one measured run."""
  d = experiment.data
  tokens, padded = sum(measurement.tokens), sum(measurement.padded_tokens)
  seconds = measurement.measured_seconds
  flops_per_token = models.model_flops_per_token(experiment.model, d.inputs_length,
                                                 d.targets_length)
  tokens_per_sec = tokens / seconds if seconds else None
  padded_per_sec = padded / seconds if seconds else None
  model_flops_per_sec = flops_per_token * padded_per_sec if padded_per_sec else None
  mfu = None
  if model_flops_per_sec and peak_flops_per_device:
    mfu = model_flops_per_sec / (peak_flops_per_device * num_devices)
  steps = len(measurement.tokens)
  return {
      "step_time_s": step_time_stats(measurement.step_durations),
      # Means over measured steps (tfds batches vary), rounded to whole tokens.
      "tokens_per_step": round(tokens / steps) if steps else None,
      "padded_tokens_per_step": round(padded / steps) if steps else None,
      "tokens_per_sec": tokens_per_sec,
      "padded_tokens_per_sec": padded_per_sec,
      "model_flops_per_token": flops_per_token,
      "model_tflops_per_sec": model_flops_per_sec / 1e12 if model_flops_per_sec else None,
      "peak_flops_per_device": peak_flops_per_device,
      "mfu": mfu,
      "peak_host_memory_bytes": peak_host_memory_bytes(),
  }
