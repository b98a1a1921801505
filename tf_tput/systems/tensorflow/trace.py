"""Where a TF step's time goes: one step under TF's full trace, summarized per device.

A TF1 Session run with RunOptions(trace_level=FULL_TRACE) returns the step's
StepStats: every op's start and duration on every device of every worker, and the
RecvTensor calls in which a device waited for a tensor from another task (gRPC).
The Chrome trace (chrome://tracing, ui.perfetto.dev) shows them on a timeline; the
summary adds them up per device. Op durations on one device overlap (TF runs
independent ops concurrently), so the sums are op-seconds, compared with the span
from the device's first op start to its last op end.
"""

import collections
import dataclasses

TRANSFER_OPS = ("RecvTensor", "_Recv", "_Send", "_HostRecv", "_HostSend")


@dataclasses.dataclass
class DeviceTime:
  device: str
  ops: int = 0
  compute_s: float = 0.0     # op-seconds of everything but transfers
  transfer_s: float = 0.0    # op-seconds of Send/Recv and RecvTensor waits
  first_us: int = 0
  last_us: int = 0

  @property
  def span_s(self) -> float:
    return (self.last_us - self.first_us) / 1e6


def _op_type(node_stats) -> str:
  label = node_stats.timeline_label  # "name = Type(inputs)" for ops; else the name
  return label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node_stats.node_name


def summarize(step_stats) -> list:
  """DeviceTime per device, merging a device's op and RecvTensor streams."""
  by_device = collections.OrderedDict()
  for dev in step_stats.dev_stats:
    row = by_device.setdefault(dev.device, DeviceTime(dev.device))
    for ns in dev.node_stats:
      seconds = ns.all_end_rel_micros / 1e6
      if _op_type(ns) in TRANSFER_OPS:
        row.transfer_s += seconds
      else:
        row.compute_s += seconds
      end = ns.all_start_micros + ns.all_end_rel_micros
      row.first_us = min(row.first_us or ns.all_start_micros, ns.all_start_micros)
      row.last_us = max(row.last_us, end)
      row.ops += 1
  return sorted(by_device.values(), key=lambda r: r.device)


def write_chrome_trace(step_stats, path: str) -> None:
  from tensorflow.python.client import timeline  # TF's own StepStats -> Chrome trace
  with open(path, "w") as f:
    f.write(timeline.Timeline(step_stats).generate_chrome_trace_format())


def format_summary(rows: list, wall_s: float) -> str:
  lines = [f"traced step: {wall_s:.3f} s wall on the controller (tracing adds overhead)",
           f"{'device':<45}{'ops':>6}{'compute op-s':>14}{'transfer op-s':>15}{'span s':>8}"]
  lines += [f"{r.device:<45}{r.ops:>6}{r.compute_s:>14.3f}{r.transfer_s:>15.3f}"
            f"{r.span_s:>8.3f}" for r in rows]
  return "\n".join(lines)
