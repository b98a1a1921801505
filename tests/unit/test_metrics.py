"""tf_tput/measure/metrics.py: step-time statistics and the summary fields."""

import pytest

from tf_tput import config
from tf_tput.measure import metrics
from tf_tput import models
from tf_tput.measure.loop import Measurement

STAT_KEYS = ("median", "mean", "p10", "p90", "min", "max")


def test_step_time_stats_known_data():
  # Sorted: 1, 2, 3, 4, 10. numpy's linear percentile: p10 at rank 0.4 -> 1 + 0.4 * 1,
  # p90 at rank 3.6 -> 4 + 0.6 * 6.
  stats = metrics.step_time_stats([4.0, 1.0, 10.0, 3.0, 2.0])
  assert set(stats) == set(STAT_KEYS)
  assert stats["median"] == 3.0
  assert stats["mean"] == 4.0
  assert stats["p10"] == pytest.approx(1.4)
  assert stats["p90"] == pytest.approx(7.6)
  assert stats["min"] == 1.0
  assert stats["max"] == 10.0
  assert all(type(v) is float for v in stats.values())


def test_step_time_stats_even_count_and_single():
  stats = metrics.step_time_stats([0.5, 0.25, 0.75, 1.0])
  assert stats["median"] == 0.625
  assert stats["mean"] == 0.625
  one = metrics.step_time_stats([0.2])
  assert all(v == 0.2 for v in one.values())


def test_step_time_stats_empty():
  assert metrics.step_time_stats([]) == {k: None for k in STAT_KEYS}


@pytest.fixture(scope="module")
def tiny_experiment():
  return config.load_experiment(
      ["gin/models/t5_tiny.gin"],
      ["DataConfig.inputs_length = 16", "DataConfig.targets_length = 8",
       "TrainConfig.global_batch = 2"])


def test_summarize_exact(tiny_experiment):
  # Two warmup steps complete at 1.0 and 2.0; four measured steps at 2.5, 3.5, 4.0, 6.0.
  m = Measurement(losses=[5.0, 4.0, 3.0, 2.5, 2.0, 1.5],
                  completion_times=[1.0, 2.0, 2.5, 3.5, 4.0, 6.0],
                  tokens=[40, 44, 46, 30], padded_tokens=[48, 48, 48, 48],
                  warmup_steps=2)
  peak = 1e9
  s = metrics.summarize(m, tiny_experiment, num_devices=4, peak_flops_per_device=peak)
  seconds = 6.0 - 2.0   # last measured completion - last warmup completion
  assert s["tokens_per_sec"] == pytest.approx(160 / seconds)
  assert s["padded_tokens_per_sec"] == pytest.approx(192 / seconds)
  assert s["tokens_per_step"] == 40          # 160 // 4
  assert s["padded_tokens_per_step"] == 48
  fpt = models.model_flops_per_token(tiny_experiment.model, 16, 8)
  assert s["model_flops_per_token"] == pytest.approx(fpt)
  assert s["model_tflops_per_sec"] == pytest.approx(fpt * (192 / seconds) / 1e12)
  # MFU counts every position (padding included) against all devices' peak.
  assert s["mfu"] == pytest.approx(fpt * (192 / seconds) / (peak * 4))
  assert s["peak_flops_per_device"] == peak
  assert s["step_time_s"] == metrics.step_time_stats([0.5, 1.0, 0.5, 2.0])
  assert s["step_time_s"]["median"] == 0.75
  assert isinstance(s["peak_host_memory_bytes"], int)
  assert s["peak_host_memory_bytes"] > 0


def test_summarize_without_peak_gives_no_mfu(tiny_experiment):
  m = Measurement(losses=[1.0, 1.0, 1.0], completion_times=[0.0, 1.0, 3.0],
                  tokens=[10, 10], padded_tokens=[16, 16], warmup_steps=1)
  s = metrics.summarize(m, tiny_experiment, num_devices=1, peak_flops_per_device=None)
  assert s["mfu"] is None
  assert s["tokens_per_sec"] == pytest.approx(20 / 3.0)
  assert s["model_tflops_per_sec"] == pytest.approx(
      models.model_flops_per_token(tiny_experiment.model, 16, 8) * 32 / 3.0 / 1e12)


def test_summarize_nothing_measured(tiny_experiment):
  # A run that failed during warmup: no measured steps, no rates, no division error.
  m = Measurement(losses=[1.0], completion_times=[1.0], warmup_steps=2,
                  error="step 1: boom")
  s = metrics.summarize(m, tiny_experiment, num_devices=1, peak_flops_per_device=1e12)
  for key in ("tokens_per_sec", "padded_tokens_per_sec", "tokens_per_step",
              "padded_tokens_per_step", "model_tflops_per_sec", "mfu"):
    assert s[key] is None, key
  assert s["step_time_s"] == {k: None for k in STAT_KEYS}
  assert s["first_step_s"] is None and s["warmup_s"] is None


def test_summarize_reports_startup_apart_from_the_steps(tiny_experiment):
  """Startup is copied from the loop's measurement and changes no rate."""
  times = dict(build_s=4.0, compile_s=2.5, first_step_s=3.0, warmup_s=3.5)
  m = Measurement(losses=[1.0, 1.0, 1.0], completion_times=[0.0, 1.0, 3.0],
                  tokens=[10, 10], padded_tokens=[16, 16], warmup_steps=1, **times)
  s = metrics.summarize(m, tiny_experiment, num_devices=1, peak_flops_per_device=None)
  assert {k: s[k] for k in metrics.STARTUP_FIELDS} == times
  assert s["tokens_per_sec"] == pytest.approx(20 / 3.0)   # as without them


def test_tf_gpu_peak_bytes_sums_the_gpus_and_is_none_without():
  import types
  from tf_tput.systems.tensorflow import runtime as tf_runtime
  peaks = {"GPU:0": 3, "GPU:1": 4}
  experimental = types.SimpleNamespace(get_memory_info=lambda name: {"peak": peaks[name]})
  tf = types.SimpleNamespace(config=types.SimpleNamespace(experimental=experimental))
  assert tf_runtime.gpu_peak_bytes(tf, ["GPU:0", "GPU:1"]) == 7
  assert tf_runtime.gpu_peak_bytes(tf, []) is None
