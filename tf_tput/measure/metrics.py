"""Throughput arithmetic: step-time statistics, tokens/s, model FLOP/s, MFU, peaks.

Conventions (docs/measurement.md): warmup steps are excluded;
tokens/s = tokens of measured steps / (completion of the last measured step -
completion of the last warmup step); MFU counts every position the model computes
(padding included) against the peak FLOP/s of all devices. Startup (build, compile,
first step, warmup) is reported beside them, never inside them.
"""

import resource
import sys
from typing import Optional, Sequence

import numpy as np

from tf_tput import models

def step_time_stats(durations: Sequence[float]) -> dict:
  d = np.asarray(durations, dtype=np.float64)
  if d.size == 0:
    return {k: None for k in ("median", "mean", "p10", "p90", "min", "max")}
  return {"median": float(np.median(d)), "mean": float(d.mean()),
          "p10": float(np.percentile(d, 10)), "p90": float(np.percentile(d, 90)),
          "min": float(d.min()), "max": float(d.max())}


def tokens_per_sec(tokens: float, seconds: float) -> Optional[float]:
  """The one throughput formula: tokens of measured steps / measured seconds."""
  return tokens / seconds if seconds else None


STARTUP_FIELDS = ("build_s", "compile_s", "first_step_s", "warmup_s")


def startup(measurement) -> dict:
  """Seconds before the measured steps (docs/measurement.md, "Startup"); None where
  the run did not get there."""
  return {name: getattr(measurement, name) for name in STARTUP_FIELDS}


def peak_host_memory_bytes() -> int:
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB


def summarize(measurement, experiment, num_devices: int,
              peak_flops_per_device: Optional[float]) -> dict:
  """The startup and throughput fields of a result record from one measured run."""
  d = experiment.data
  tokens, padded = sum(measurement.tokens), sum(measurement.padded_tokens)
  seconds = measurement.measured_seconds
  flops_per_token = models.model_flops_per_token(experiment.model, d.inputs_length,
                                                 d.targets_length)
  tokens_per_sec_ = tokens_per_sec(tokens, seconds)
  padded_per_sec = tokens_per_sec(padded, seconds)
  model_flops_per_sec = flops_per_token * padded_per_sec if padded_per_sec else None
  mfu = None
  if model_flops_per_sec and peak_flops_per_device:
    mfu = model_flops_per_sec / (peak_flops_per_device * num_devices)
  steps = len(measurement.tokens)
  return {
      **startup(measurement),
      "step_time_s": step_time_stats(measurement.step_durations),
      # Means over measured steps (tfds batches vary), rounded to whole tokens.
      "tokens_per_step": round(tokens / steps) if steps else None,
      "padded_tokens_per_step": round(padded / steps) if steps else None,
      "tokens_per_sec": tokens_per_sec_,
      "padded_tokens_per_sec": padded_per_sec,
      "model_flops_per_token": flops_per_token,
      "model_tflops_per_sec": model_flops_per_sec / 1e12 if model_flops_per_sec else None,
      "peak_flops_per_device": peak_flops_per_device,
      "mfu": mfu,
      "peak_host_memory_bytes": peak_host_memory_bytes(),
  }
