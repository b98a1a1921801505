"""The shared measured loop: every system is timed here, never by itself.

The clock reads when a window's losses are on the host, so its steps have completed
on the device. A window is `sync_every` steps (default 1: every step): the loop
dispatches them, fetches their losses, then reads the clock. tokens/s runs from the
completion of the last warmup window to that of the last measured one
(measure/metrics.py). What is inside the clock besides the steps (docs/measurement.md,
"The clock and sync_every"): taking a prebuilt or prefetched batch (data.batches),
counting its tokens and one log line every log_every steps; TensorBoard scalars are
buffered and handed to on_step after the loop.

Startup is timed on the same clock (docs/measurement.md, "Startup"): the trainer's
ahead-of-time compile where it has one (compile_s), the first step (first_step_s,
compile included) and the whole warmup (warmup_s); train measures build_s on it too.
"""

import dataclasses
import itertools
import math
import time
from typing import Callable, Iterator, Optional

from absl import logging

from tf_tput import data, errors


@dataclasses.dataclass
class Measurement:
  """What the loop saw; partial when the run failed (then `error` says why)."""
  losses: list = dataclasses.field(default_factory=list)       # every step, warmup too
  completion_times: list = dataclasses.field(default_factory=list)  # every window
  tokens: list = dataclasses.field(default_factory=list)        # measured steps only
  padded_tokens: list = dataclasses.field(default_factory=list)  # measured steps only
  warmup_steps: int = 0
  sync_every: int = 1        # steps per timed window
  synchronous_step: Optional[bool] = None  # the trainer's; None: unbuilt
  error: Optional[str] = None
  # Startup, in seconds on CLOCK; None where the run did not get that far (or, for
  # compile_s, where the trainer does not compile ahead).
  build_s: Optional[float] = None        # the run's start to a built trainer (train)
  compile_s: Optional[float] = None      # trainer.compile(first batch)
  first_step_s: Optional[float] = None   # compile_s + the first step, its loss on the host
  warmup_s: Optional[float] = None       # compile_s + every warmup window
  # CLOCK when the loop began: the origin of the first window (the watchdog's, for a
  # run that has not completed one; runtime/watchdog.py).
  loop_started: Optional[float] = None

  @property
  def steps_completed(self) -> int:
    return len(self.losses)

  @property
  def _measured_times(self) -> list:
    """Completion of the last warmup window, then of each measured window."""
    return self.completion_times[self.warmup_steps // self.sync_every - 1:]

  @property
  def step_durations(self) -> list:
    """Per measured step: its window's duration / sync_every."""
    times, k = self._measured_times, self.sync_every
    return [(b - a) / k for a, b in itertools.pairwise(times) for _ in range(k)]

  @property
  def measured_seconds(self) -> float:
    times = self._measured_times
    return times[-1] - times[0] if len(times) > 1 else 0.0

  @property
  def window_durations(self) -> list:
    """Seconds of each measured window, in order (the record's window_s)."""
    times = self._measured_times
    return [b - a for a, b in itertools.pairwise(times)]

  def snapshot(self) -> "Measurement":
    """A copy holding the completed windows only, consistent while the loop goes on in
    another thread (the watchdog records a run whose loop cannot return)."""
    times = list(self.completion_times)
    done = len(times) * self.sync_every
    return dataclasses.replace(
        self, completion_times=times, losses=list(self.losses[:done]),
        tokens=list(self.tokens[:max(0, done - self.warmup_steps)]),
        padded_tokens=list(self.padded_tokens[:max(0, done - self.warmup_steps)]))


# The one clock of a run: steps, startup and train's build time.
CLOCK = time.perf_counter


class StepTimer:
  """Records the completion time of each window on a monotonic clock; now() reads the
  same clock without recording (the startup marks)."""

  def __init__(self, clock: Callable[[], float] = CLOCK):
    self._clock = clock
    self.times = []

  def now(self) -> float:
    return self._clock()

  def mark(self) -> float:
    self.times.append(self._clock())
    return self.times[-1]


class ProbedTimer(StepTimer):
  """A StepTimer that reads `probe()` (e.g. a network byte counter) just before the
  clock's start mark and just after its last: the readings bracket the measured steps
  and neither is charged to them."""

  def __init__(self, probe: Callable[[], float], warmup_steps: int, steps: int,
               sync_every: int = 1, clock: Callable[[], float] = CLOCK):
    super().__init__(clock)
    self._probe = probe
    self._start_mark = warmup_steps // sync_every - 1
    self._last_mark = (warmup_steps + steps) // sync_every - 1
    self.at_start = self.at_end = None

  def mark(self) -> float:
    index = len(self.times)
    if index == self._start_mark:
      self.at_start = self._probe()
    now = super().mark()
    if index == self._last_mark:
      self.at_end = self._probe()
    return now

  @property
  def measured_change(self) -> Optional[float]:
    """probe() at the end minus at the start; None if the run did not get there."""
    if self.at_start is None or self.at_end is None:
      return None
    return self.at_end - self.at_start


def run(trainer, batches: Iterator[dict], steps: int, warmup_steps: int,
        log_every: int = 10, on_step: Optional[Callable[[int, dict], None]] = None,
        timer: Optional[StepTimer] = None, sync_every: int = 1,
        build_s: Optional[float] = None,
        should_stop: Callable[[], bool] = lambda: False,
        measurement: Optional[Measurement] = None) -> Measurement:
  """Runs warmup_steps + steps optimizer steps; returns what was measured.

  warmup_steps and steps are multiples of sync_every (config.validate checks it).
  The loop runs steps through trainer.dispatch(batch), a loss float() waits for:
  one still pending (not trainer.synchronous_step) lets up to sync_every steps run
  before the loop waits; a synchronous trainer's dispatch is its step, and the window
  only spaces out the clock reads. An exception inside a step ends the loop and is
  recorded in `error`; the partial measurement is returned so a failed run can still
  be written down. A non-finite loss is recorded the same way: a diverged run's speed
  is not a result. `on_step(step, scalars)` receives the per-step scalars (e.g. for
  TensorBoard) after the loop, outside the clock.
  A trainer that compiles_ahead compiles its step for the first batch before the
  first dispatch, timed as compile_s (and inside first_step_s and warmup_s); a
  failure there is step 0's. build_s (train's) is kept in the measurement as given.
  should_stop() is asked before each window: True ends the loop there, the windows so
  far kept (a signal asked the run to end; the caller knows which). The loop fills
  `measurement` when given (another thread may read it as it grows: snapshot()).
  """
  timer = timer or StepTimer()
  m = measurement or Measurement()
  m.warmup_steps, m.completion_times, m.sync_every = warmup_steps, timer.times, sync_every
  m.synchronous_step, m.build_s = trainer.synchronous_step, build_s
  scalars = []  # (step, scalars), written after the loop
  try:
    started = m.loop_started = timer.now()
    batches = None if should_stop() else _compiled(trainer, batches, m, timer, started)
    if batches is not None:
      _windows(trainer, batches, warmup_steps + steps, m, timer, log_every, scalars,
               started, should_stop)
  finally:
    if on_step:
      for step, values in scalars:
        on_step(step, values)
  if m.error:
    logging.error("run failed at %s", m.error)
  return m


def _compiled(trainer, batches, m, timer, started):
  """Runs the trainer's compile(first batch) where it compiles_ahead, timing it; the
  batches from the first on, or None when the compile failed (m.error says why)."""
  if not trainer.compiles_ahead:
    return batches
  try:
    first = next(batches)
    trainer.compile(first)
  except Exception as e:  # noqa: BLE001 - a failed compile is a failed first step
    logging.error("compiling step 0 failed", exc_info=True)
    m.error = f"step 0: compile: {errors.cause(e)}"
    return None
  m.compile_s = timer.now() - started
  return itertools.chain([first], batches)


def _windows(trainer, batches, total, m, timer, log_every, scalars, started,
             should_stop) -> None:
  k, warmup_steps = m.sync_every, m.warmup_steps
  for first in range(0, total, k):
    if should_stop():
      logging.info("stopping before step %d, as asked", first)
      return
    pending, counts = [], []
    step = first
    try:
      for step in range(first, first + k):
        batch = next(batches)
        pending.append(trainer.dispatch(batch))
        counts.append(data.count_tokens(batch) if step >= warmup_steps else None)
      for step, loss in enumerate(pending, start=first):
        m.losses.append(float(loss))  # waits for the step when it is pending
        if step == 0 and k > 1:  # (k == 1: the window's mark below is the step's end)
          m.first_step_s = timer.now() - started
    except Exception as e:  # noqa: BLE001 - any failure ends the run, recorded
      logging.error("step %d failed", step, exc_info=True)  # the whole of it, in the log
      m.error = f"step {step}: {errors.cause(e)}"
      _keep_completed(m.losses, pending[len(m.losses) - first:])
      return
    if first + k == warmup_steps:  # logged before the clock's start mark: not charged
      logging.info("warmup done (%d steps, loss %.4f); measuring %d steps",
                   warmup_steps, m.losses[-1], total - warmup_steps)
    timer.mark()
    if first == 0 and k == 1:
      m.first_step_s = timer.times[0] - started
    if first + k == warmup_steps:
      m.warmup_s = timer.times[-1] - started
    losses = m.losses[first:]
    bad = next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
    window = timer.times[-1] - timer.times[-2] if len(timer.times) > 1 else None
    for i, (loss, count) in enumerate(zip(losses, counts, strict=True)):
      values = {"loss": loss}
      if count is not None:
        m.tokens.append(count[0])
        m.padded_tokens.append(count[1])
        values.update(step_time_s=window / k, tokens_per_sec=count[0] * k / window)
      scalars.append((first + i, values))
    if bad is not None:
      m.error = f"step {first + bad}: loss is {losses[bad]}"
      return
    last = first + k - 1  # progress lines are inside the clock: one per log_every steps
    if last >= warmup_steps and ((last - warmup_steps + 1) % log_every < k
                                 or last == total - 1):
      logging.info("step %d/%d  loss %.4f  step time %.4fs", last - warmup_steps + 1,
                   total - warmup_steps, losses[-1], window / k)


def _keep_completed(losses: list, unfetched: list) -> None:
  """After a failure, the losses of the window's steps that did complete (host floats
  from step(), or pending losses that still fetch), up to the first that does not."""
  for loss in unfetched:
    try:
      losses.append(float(loss))
    except Exception:  # noqa: BLE001 - the failing step; the error is already recorded
      return
