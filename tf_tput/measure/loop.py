"""The shared measured loop: every system is timed here, never by itself.

`trainer.step(batch)` returns the loss as a host float, so the step has completed on
the device when the clock reads. The clock starts at the completion of the last
warmup step; each measured step's duration runs from the previous completion to its
own, so data fetching and dispatch are inside the measurement for every system alike.
"""

import dataclasses
import math
import time
from typing import Callable, Iterator, Optional

from absl import logging

from tf_tput import data, errors


@dataclasses.dataclass
class Measurement:
  """What the loop saw; partial when the run failed (then `error` says why)."""
  losses: list = dataclasses.field(default_factory=list)       # every step, warmup too
  completion_times: list = dataclasses.field(default_factory=list)  # every step
  tokens: list = dataclasses.field(default_factory=list)        # measured steps only
  padded_tokens: list = dataclasses.field(default_factory=list)  # measured steps only
  warmup_steps: int = 0
  error: Optional[str] = None

  @property
  def steps_completed(self) -> int:
    return len(self.losses)

  @property
  def _measured_times(self) -> list:
    """Completion of the last warmup step, then of each measured step."""
    return self.completion_times[self.warmup_steps - 1:]

  @property
  def step_durations(self) -> list:
    times = self._measured_times
    return [b - a for a, b in zip(times, times[1:])]

  @property
  def measured_seconds(self) -> float:
    times = self._measured_times
    return times[-1] - times[0] if len(times) > 1 else 0.0


class StepTimer:
  """Records the completion time of each step on a monotonic clock."""

  def __init__(self, clock: Callable[[], float] = time.perf_counter):
    self._clock = clock
    self.times = []

  def mark(self) -> float:
    self.times.append(self._clock())
    return self.times[-1]


def run(trainer, batches: Iterator[dict], steps: int, warmup_steps: int,
        log_every: int = 10, on_step: Optional[Callable[[int, dict], None]] = None,
        timer: Optional[StepTimer] = None) -> Measurement:
  """Runs warmup_steps + steps optimizer steps; returns what was measured.

  An exception inside a step ends the loop and is recorded in `error`; the partial
  measurement is returned so a failed run can still be written down. A non-finite
  loss is recorded the same way: a diverged run's speed is not a result.
  `on_step(step, scalars)` receives per-step scalars (e.g. for TensorBoard).
  """
  timer = timer or StepTimer()
  m = Measurement(warmup_steps=warmup_steps, completion_times=timer.times)
  total = warmup_steps + steps
  for step in range(total):
    try:
      batch = next(batches)
      loss = float(trainer.step(batch))
    except Exception as e:  # noqa: BLE001: any failure ends the run, recorded
      m.error = f"step {step}: {errors.one_line(e)}"
      logging.error("run failed at %s", m.error)
      return m
    timer.mark()
    m.losses.append(loss)
    measured = step >= warmup_steps
    if measured:
      tokens, padded = data.count_tokens(batch)
      m.tokens.append(tokens)
      m.padded_tokens.append(padded)
    if not math.isfinite(loss):
      m.error = f"step {step}: loss is {loss}"
      logging.error("run failed at %s", m.error)
      return m
    step_time = timer.times[-1] - timer.times[-2] if step else None
    if on_step:
      scalars = {"loss": loss}
      if measured and step_time is not None:
        scalars.update(step_time_s=step_time, tokens_per_sec=m.tokens[-1] / step_time)
      on_step(step, scalars)
    if step == warmup_steps - 1:
      logging.info("warmup done (%d steps, loss %.4f); measuring %d steps",
                   warmup_steps, loss, steps)
    elif measured and ((step - warmup_steps + 1) % log_every == 0 or step == total - 1):
      logging.info("step %d/%d  loss %.4f  step time %.4fs", step - warmup_steps + 1,
                   steps, loss, step_time)
  return m
