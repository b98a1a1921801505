"""TensorBoard scalars written with tensorboard's own event writer (no TF graph needed)."""

import time

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter


class ScalarWriter:
  def __init__(self, logdir: str):
    self._writer = EventFileWriter(logdir)

  def write(self, step: int, scalars: dict) -> None:
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in scalars.items()])
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                           summary=summary))

  def close(self) -> None:
    self._writer.close()
