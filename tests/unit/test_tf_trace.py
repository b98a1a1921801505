"""tf_trace.summarize: op-seconds per device, transfers apart, spans."""

import pytest

from tf_tput.systems.tensorflow import trace as tf_trace

step_stats_pb2 = pytest.importorskip("tensorflow.core.framework.step_stats_pb2")


def _node(name, op, start_us, duration_us):
  return step_stats_pb2.NodeExecStats(
      node_name=name, timeline_label=f"{name} = {op}(a, b)",
      all_start_micros=start_us, all_end_rel_micros=duration_us)


def test_a_devices_streams_merge_and_transfers_count_apart():
  stats = step_stats_pb2.StepStats(dev_stats=[
      step_stats_pb2.DeviceStepStats(device="/job:worker/task:1/device:CPU:0", node_stats=[
          _node("matmul", "_MklMatMul", 1_000_000, 300_000),
          _node("add", "AddV2", 1_200_000, 100_000),
          _node("recv", "_Recv", 1_000_000, 50_000)]),
      step_stats_pb2.DeviceStepStats(device="/job:worker/task:0/device:CPU:0", node_stats=[
          _node("mul", "Mul", 2_000_000, 10_000)]),
      step_stats_pb2.DeviceStepStats(device="/job:worker/task:1/device:CPU:0", node_stats=[
          step_stats_pb2.NodeExecStats(node_name="RecvTensor", timeline_label="RecvTensor",
                                       all_start_micros=1_400_000,
                                       all_end_rel_micros=200_000)]),
  ])
  task0, task1 = tf_trace.summarize(stats)
  assert task0.device.startswith("/job:worker/task:0") and task0.ops == 1
  assert task1.ops == 4
  assert task1.compute_s == pytest.approx(0.4)
  assert task1.transfer_s == pytest.approx(0.25)
  assert task1.span_s == pytest.approx(0.6)  # 1.0 s .. 1.6 s
  text = tf_trace.format_summary([task0, task1], wall_s=0.7)
  assert "0.700 s wall" in text and "/job:worker/task:1/device:CPU:0" in text
