"""tf_tput/dcn.py: the §5.3 projection by hand, and the efficiency calibration."""

import dataclasses

import pytest

from tf_tput import config, dcn, models

from record_fixtures import train_record


def _experiment():
  return config.load_experiment(["gin/models/decoder_tiny.gin"],
                                ["TrainConfig.global_batch = 8",
                                 "DataConfig.targets_length = 128"])


def test_projection_by_hand():
  e = _experiment()
  a = dcn.Assumptions(hosts_per_island=2, gbps_per_host=8.0, link_efficiency=0.5,
                      overlap=0.5, peak_flops_per_device=1e12, mfu=0.25)
  p = dcn.project(e, 2, 4, a)
  gradient = 4 * models.num_params(e.model)
  assert p["bytes_per_reduction"] == 2 * gradient and p["bytes_sent_per_island"] == gradient
  assert p["transfer_s"] == pytest.approx(gradient / (2 * 1e9 * 0.5))  # 2 x 1 GB/s x 0.5
  compute = 8 * 128 * models.model_flops_per_token(e.model, 0, 128) / (8 * 1e12 * 0.25)
  assert p["compute_s"] == pytest.approx(compute)
  exposed = max(0.0, p["transfer_s"] - 0.5 * 2 / 3 * compute)
  assert p["exposed_s"] == pytest.approx(exposed)
  assert p["fraction_of_single_island"] == pytest.approx(compute / (compute + exposed))
  hidden = dcn.project(e, 2, 4, dcn.Assumptions(2, 8.0, 0.5, 1.0, 1e12, 0.25))
  assert hidden["exposed_s"] <= p["exposed_s"]


def _island_run(rate, median_s, run_id, link_bytes=1e6):
  return train_record(model="decoder_deep", system="jax", run_id=run_id, arch="decoder",
                      inputs_length=None, islands=2, devices_per_island=2, dcn_rate=rate,
                      num_processes=2, link_bytes_per_step=link_bytes,
                      link_bytes_per_step_analytic=link_bytes,
                      step_s=(median_s, median_s, median_s))


def test_efficiency_is_the_ideal_link_time_over_the_time_lost():
  # 1 MB per step over 2 islands: 0.5 MB each at 8 Mbit/s takes 0.5 s ideally.
  records = [_island_run("none", 1.0, "a"), _island_run("8mbit", 2.0, "b"),
             _island_run("4mbit", 2.25, "c")]
  efficiency, runs = dcn.calibrate_efficiency(records)
  assert runs == 2
  assert efficiency == pytest.approx((0.5 / 1.0 + 1.0 / 1.25) / 2)
  assert dcn.calibrate_efficiency(records[1:]) is None  # no unshaped run to compare
  # A pipeline's transfers overlap its compute: its runs do not time the link.
  piped = [dict(r, pipeline_stages=4, micro_batches=16) for r in records]
  assert dcn.calibrate_efficiency(piped) is None


def test_pipeline_projection_by_hand():
  e = config.load_experiment(["gin/models/decoder_deep.gin", "gin/pipeline/s4_m16.gin"],
                             ["TrainConfig.global_batch = 32",
                              "DataConfig.targets_length = 64"])
  a = dcn.Assumptions(hosts_per_island=1, gbps_per_host=8.0, link_efficiency=0.5,
                      overlap=0.0, peak_flops_per_device=1e9, mfu=0.5)
  p = dcn.project_pipeline(e, 2, 2, a)
  micro = 2 * 64 * 128 * 4
  embedding = 512 * 128 * 4
  assert p["bytes_per_step"] == 1 * 2 * 16 * micro + 2 * embedding
  bandwidth = 1e9 * 0.5  # 1 host per island, 2 stages each: at least 1 host a stage
  assert p["stage_dcn_bytes_per_s"] == pytest.approx(bandwidth)
  compute = 32 * 64 * models.model_flops_per_token(e.model, 0, 64) / (4 * 1e9 * 0.5)
  slot = compute / 19
  t = micro / bandwidth
  behind = 16 * (max(0.0, t - slot / 3) + max(0.0, t - 2 * slot / 3))
  exposed = 2 * t + behind + embedding / bandwidth
  assert p["exposed_s"] == pytest.approx(exposed)
  assert p["fraction_of_single_island"] == pytest.approx(compute / (compute + exposed))
  slow = dcn.project_pipeline(e, 2, 2, dataclasses.replace(a, gbps_per_host=0.001))
  assert slow["fraction_of_single_island"] < p["fraction_of_single_island"]
