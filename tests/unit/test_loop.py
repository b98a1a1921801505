"""tf_tput/measure/loop.py: the shared measured loop, with a fake trainer and a fake clock."""

import itertools
import math

import numpy as np
import pytest

from tf_tput import systems
from tf_tput.measure import loop


class FakeTrainer(systems.Trainer):
  """step() returns scripted losses; optionally raises at a given (0-based) step."""

  def __init__(self, losses=None, fail_at=None):
    self.losses = losses
    self.fail_at = fail_at
    self.batches = []

  def step(self, batch):
    step = len(self.batches)
    self.batches.append(batch)
    if step == self.fail_at:
      raise RuntimeError("device\nexploded")
    if self.losses is not None:
      return self.losses[step]
    return np.float32(10.0 / (step + 1))   # decreasing, a numpy scalar like real systems


def scripted_clock(times):
  it = iter(times)
  return lambda: next(it)


def make_batches():
  """Endless batches: step i has targets with (i + 1) non-zero tokens out of 8."""
  for i in itertools.count():
    targets = np.zeros((2, 4), np.int32)
    targets.flat[: i + 1] = 5
    yield {"targets": targets}


TIMES = [10.0, 12.0, 12.5, 13.5, 13.75, 15.75]   # completion of steps 0..5
STARTED = [9.0]   # the loop's start mark (startup), read before step 0's dispatch


def test_run_records_losses_tokens_and_durations():
  trainer = FakeTrainer()
  timer = loop.StepTimer(clock=scripted_clock(STARTED + TIMES))
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, timer=timer)
  assert m.error is None
  assert m.warmup_steps == 2
  assert m.steps_completed == 6
  assert m.losses == pytest.approx([10.0 / (i + 1) for i in range(6)])
  assert all(type(x) is float for x in m.losses)
  assert m.completion_times == TIMES
  # Tokens of measured steps only (steps 2..5 have 3..6 non-zero of 8 positions).
  assert m.tokens == [3, 4, 5, 6]
  assert m.padded_tokens == [8, 8, 8, 8]
  # Each measured step runs from the previous completion to its own.
  assert m.step_durations == [0.5, 1.0, 0.25, 2.0]
  assert m.measured_seconds == 15.75 - 12.0
  assert len(trainer.batches) == 6


def test_run_trainer_raises_at_step_3():
  trainer = FakeTrainer(fail_at=3)
  timer = loop.StepTimer(clock=scripted_clock(STARTED + TIMES))
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, timer=timer)
  assert m.error is not None
  assert "step 3" in m.error
  assert "RuntimeError" in m.error and "device exploded" in m.error
  assert "\n" not in m.error
  assert m.losses == pytest.approx([10.0, 5.0, 10.0 / 3])   # steps 0..2 completed
  assert m.tokens == [3]                                   # step 2 was measured
  assert m.completion_times == TIMES[:3]
  assert m.step_durations == [0.5]


def test_run_batches_exhausted_is_an_error():
  trainer = FakeTrainer()
  batches = iter([{"targets": np.ones((1, 2), np.int32)}] * 2)
  m = loop.run(trainer, batches, steps=3, warmup_steps=1,
                    timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.error is not None and "step 2" in m.error
  assert m.steps_completed == 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_run_non_finite_loss_is_an_error(bad):
  trainer = FakeTrainer(losses=[3.0, 2.0, bad, 1.0, 0.5])
  m = loop.run(trainer, make_batches(), steps=3, warmup_steps=2,
                    timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.error is not None
  assert "step 2" in m.error
  assert m.steps_completed == 3            # the bad step is recorded, then the loop ends
  assert not math.isfinite(m.losses[-1])
  assert len(trainer.batches) == 3


def test_run_on_step_receives_scalars():
  seen = []
  trainer = FakeTrainer()
  timer = loop.StepTimer(clock=scripted_clock(STARTED + TIMES))
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, timer=timer,
                    on_step=lambda step, scalars: seen.append((step, scalars)))
  assert m.error is None
  assert [step for step, _ in seen] == list(range(6))
  # Warmup steps: the loss only.
  assert seen[0][1] == {"loss": pytest.approx(10.0)}
  assert seen[1][1] == {"loss": pytest.approx(5.0)}
  # Measured steps: loss, step time, tokens/s of that step.
  durations = [0.5, 1.0, 0.25, 2.0]
  for (step, scalars), duration, tokens in zip(seen[2:], durations, [3, 4, 5, 6], strict=True):
    assert set(scalars) == {"loss", "step_time_s", "tokens_per_sec"}
    assert scalars["loss"] == pytest.approx(10.0 / (step + 1))
    assert scalars["step_time_s"] == pytest.approx(duration)
    assert scalars["tokens_per_sec"] == pytest.approx(tokens / duration)
    assert all(isinstance(v, float) for v in scalars.values())


def test_measurement_properties_directly():
  m = loop.Measurement(completion_times=[1.0, 2.0, 4.0, 7.0], warmup_steps=1)
  assert m.step_durations == [1.0, 2.0, 3.0]
  assert m.measured_seconds == 6.0
  m = loop.Measurement(completion_times=[1.0, 2.0], warmup_steps=2)
  assert m.step_durations == []
  assert m.measured_seconds == 0.0


def test_step_timer_marks_clock():
  timer = loop.StepTimer(clock=scripted_clock([3.0, 4.5]))
  assert timer.mark() == 3.0
  assert timer.mark() == 4.5
  assert timer.times == [3.0, 4.5]


class CountingSource:
  """Batches as make_batches(); counts how often one is generated, and when."""

  def __init__(self, trainer):
    self.trainer = trainer
    self.generated_at = []   # steps the trainer had taken when each batch was made
    self._batches = make_batches()

  def __iter__(self):
    return self

  def __next__(self):
    self.generated_at.append(len(self.trainer.batches))
    return next(self._batches)


def test_synthetic_batches_are_built_before_the_first_step():
  from tf_tput import data
  trainer = FakeTrainer()
  source = CountingSource(trainer)
  batches = data.ring(source, 6)
  m = loop.run(trainer, batches, steps=4, warmup_steps=2,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.error is None
  assert source.generated_at == [0] * 6   # all six made before step 0, none later
  assert m.tokens == [3, 4, 5, 6]          # and still distinct batches per step


def test_a_ring_cycles_when_the_run_is_longer():
  from tf_tput import data
  trainer = FakeTrainer()
  source = CountingSource(trainer)
  m = loop.run(trainer, data.ring(source, 2), steps=4, warmup_steps=2,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert len(source.generated_at) == 2
  assert m.tokens == [1, 2, 1, 2]


def test_on_step_work_does_not_change_measured_durations():
  """TensorBoard writes happen after the loop: a writer that reads the clock (as a
  slow write would advance it) leaves every step's duration as it was."""
  ticks = iter(STARTED + TIMES + [100.0 + i for i in range(10)])
  clock = lambda: next(ticks)
  seen = []
  def slow_writer(step, scalars):
    seen.append((step, clock()))  # time passes in the writer
  m = loop.run(FakeTrainer(), make_batches(), steps=4, warmup_steps=2,
               timer=loop.StepTimer(clock=clock), on_step=slow_writer)
  assert m.step_durations == [0.5, 1.0, 0.25, 2.0]
  assert m.completion_times == TIMES
  assert [step for step, _ in seen] == list(range(6))
  assert all(t >= 100.0 for _, t in seen)   # every write came after the last step


class DispatchingTrainer(FakeTrainer):
  """dispatch() returns a pending loss; float() of it is a fetch, counted."""
  synchronous_step = False

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.fetches = []   # steps dispatched when each fetch happened

  def dispatch(self, batch):
    loss = super().step(batch)
    trainer = self

    class Pending:
      def __float__(self):
        trainer.fetches.append(len(trainer.batches))
        return float(loss)
    return Pending()

  def step(self, batch):  # the loop must not call it when dispatch exists
    raise AssertionError("step() called on a dispatching trainer")


WINDOW_TIMES = [10.0, 12.0, 13.0, 16.0]   # completion of windows (2 steps each)
# The start mark, then step 0's loss on the host (its window's other step in flight).
WINDOW_STARTED = [8.0, 9.5]


def test_sync_every_2_fetches_once_per_window_and_times_windows():
  trainer = DispatchingTrainer()
  m = loop.run(trainer, make_batches(), steps=6, warmup_steps=2, sync_every=2,
               timer=loop.StepTimer(clock=scripted_clock(WINDOW_STARTED + WINDOW_TIMES)))
  assert m.error is None and m.synchronous_step is False
  # Two losses fetched after each pair of dispatches: never more than 2 in flight.
  assert trainer.fetches == [2, 2, 4, 4, 6, 6, 8, 8]
  assert m.losses == pytest.approx([10.0 / (i + 1) for i in range(8)])
  assert m.completion_times == WINDOW_TIMES
  # Each window's duration / 2 for each of its steps.
  assert m.step_durations == [1.0, 1.0, 0.5, 0.5, 1.5, 1.5]
  assert m.measured_seconds == 16.0 - 10.0   # from the warmup window's completion
  assert m.tokens == [3, 4, 5, 6, 7, 8]


def test_sync_every_2_with_a_synchronous_trainer_keeps_every_loss():
  trainer = FakeTrainer()
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, sync_every=2,
               timer=loop.StepTimer(clock=scripted_clock(WINDOW_STARTED + WINDOW_TIMES)))
  assert m.synchronous_step is True
  assert m.losses == pytest.approx([10.0 / (i + 1) for i in range(6)])
  assert m.completion_times == WINDOW_TIMES[:3]
  assert m.step_durations == [1.0, 1.0, 0.5, 0.5]


def test_sync_every_2_failure_mid_window_keeps_completed_losses():
  trainer = FakeTrainer(fail_at=3)
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, sync_every=2,
               timer=loop.StepTimer(clock=scripted_clock(WINDOW_STARTED + WINDOW_TIMES)))
  assert m.error is not None and "step 3" in m.error
  assert m.losses == pytest.approx([10.0, 5.0, 10.0 / 3])   # step 2 completed
  assert m.completion_times == WINDOW_TIMES[:1]            # its window did not
  assert m.tokens == []


def test_sync_every_2_dispatch_failure_keeps_the_dispatched_steps_losses():
  trainer = DispatchingTrainer(fail_at=3)   # dispatch() of step 3 raises
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, sync_every=2,
               timer=loop.StepTimer(clock=scripted_clock(WINDOW_STARTED + WINDOW_TIMES)))
  assert m.error is not None and "step 3" in m.error
  assert m.losses == pytest.approx([10.0, 5.0, 10.0 / 3])   # step 2 was dispatched: fetched
  assert trainer.fetches == [2, 2, 4]
  assert m.completion_times == WINDOW_TIMES[:1]


def test_the_warmup_line_is_logged_before_the_clock_starts(monkeypatch):
  """The clock starts at the last warmup completion: a log line after it would be
  charged to the first measured step."""
  timer = loop.StepTimer(clock=scripted_clock(STARTED + TIMES))
  marks_at_log = []
  def info(msg, *args):
    marks_at_log.append((msg.split()[0], len(timer.times)))
  monkeypatch.setattr(loop.logging, "info", info)
  m = loop.run(FakeTrainer(), make_batches(), steps=4, warmup_steps=2, timer=timer,
               log_every=2)
  assert m.error is None
  # "warmup" with one mark taken (step 0's), not two; progress lines after steps 2 and 4.
  assert marks_at_log == [("warmup", 1), ("step", 4), ("step", 6)]


@pytest.mark.parametrize("binding, message", [
    ("TrainConfig.sync_every = 0", "TrainConfig.sync_every = 0; it must be an integer >= 1"),
    ("TrainConfig.sync_every = 3", "TrainConfig.warmup_steps = 2 is not a multiple of "
                                   "TrainConfig.sync_every = 3; pass --warmup_steps=3"),
    ("TrainConfig.sync_every = 2", "TrainConfig.steps = 5 is not a multiple of "
                                   "TrainConfig.sync_every = 2; pass --steps=6"),
])
def test_bad_sync_every_is_a_usage_error(binding, message):
  from tf_tput import config
  from tf_tput.errors import UsageError
  with pytest.raises(UsageError) as e:
    config.load_experiment(["gin/models/t5_tiny.gin"],
                           ["TrainConfig.steps = 5", binding])
  assert str(e.value) == message


def test_startup_figures_on_the_loops_clock():
  """first_step_s: the start mark to step 0's completion; warmup_s: to the last warmup
  window's; build_s as train gave it; no compile() -> compile_s None."""
  m = loop.run(FakeTrainer(), make_batches(), steps=4, warmup_steps=2, build_s=3.25,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.build_s == 3.25 and m.compile_s is None
  assert m.first_step_s == TIMES[0] - STARTED[0]
  assert m.warmup_s == TIMES[1] - STARTED[0]
  assert m.measured_seconds == TIMES[-1] - TIMES[1]   # startup is not in the steps


def test_startup_with_sync_every_2_times_step_0_alone():
  m = loop.run(DispatchingTrainer(), make_batches(), steps=6, warmup_steps=2,
               sync_every=2,
               timer=loop.StepTimer(clock=scripted_clock(WINDOW_STARTED + WINDOW_TIMES)))
  assert m.first_step_s == WINDOW_STARTED[1] - WINDOW_STARTED[0]
  assert m.warmup_s == WINDOW_TIMES[0] - WINDOW_STARTED[0]


class CompilingTrainer(FakeTrainer):
  """compile(batch) records the batch it compiled for; optionally raises."""
  compiles_ahead = True

  def __init__(self, compile_error=None, **kwargs):
    super().__init__(**kwargs)
    self.compiled_for = []
    self.compile_error = compile_error

  def compile(self, batch):
    if self.compile_error:
      raise self.compile_error
    self.compiled_for.append(batch)


def test_compile_runs_once_before_step_0_on_its_batch_and_is_timed():
  trainer = CompilingTrainer()
  # start 9.0, compiled at 9.75, then the steps' completions
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + [9.75] + TIMES)))
  assert m.error is None
  assert len(trainer.compiled_for) == 1
  assert trainer.compiled_for[0] is trainer.batches[0]   # step 0 runs the compiled batch
  assert len(trainer.batches) == 6 and m.tokens == [3, 4, 5, 6]   # no batch lost
  assert m.compile_s == 0.75
  assert m.first_step_s == TIMES[0] - STARTED[0]   # the compile is inside the first step
  assert m.warmup_s == TIMES[1] - STARTED[0]


def test_a_failed_compile_is_step_0s_failure_and_keeps_build_s():
  trainer = CompilingTrainer(compile_error=MemoryError("out of memory"))
  m = loop.run(trainer, make_batches(), steps=4, warmup_steps=2, build_s=2.0,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.error.startswith("step 0: compile:") and "out of memory" in m.error
  assert m.build_s == 2.0 and m.compile_s is None and m.first_step_s is None
  assert trainer.batches == [] and m.losses == []


def test_a_failed_first_step_keeps_build_s_and_a_later_failure_first_step_s():
  m = loop.run(FakeTrainer(fail_at=0), make_batches(), steps=4, warmup_steps=2,
               build_s=2.0, timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.build_s == 2.0 and m.first_step_s is None and m.warmup_s is None
  m = loop.run(FakeTrainer(fail_at=1), make_batches(), steps=4, warmup_steps=2,
               timer=loop.StepTimer(clock=scripted_clock(STARTED + TIMES)))
  assert m.first_step_s == TIMES[0] - STARTED[0] and m.warmup_s is None


def test_should_stop_ends_the_loop_before_the_next_window_keeping_the_ones_done():
  trainer = FakeTrainer()
  m = loop.Measurement()
  asked = iter([False] * 5 + [True])  # before any compile, then before each window
  result = loop.run(trainer, make_batches(), steps=10, warmup_steps=1,
                    timer=loop.StepTimer(scripted_clock(range(100))),
                    should_stop=lambda: next(asked), measurement=m)
  assert result is m and m.error is None  # filled in place: another thread reads it
  assert len(trainer.batches) == 4 and m.steps_completed == 4
  assert len(m.tokens) == 3 and m.window_durations == [1.0, 1.0, 1.0]
  assert m.loop_started == 0


def test_a_snapshot_holds_only_the_completed_windows():
  m = loop.Measurement(losses=[5.0, 4.0, 3.0, 2.0], completion_times=[1.0, 2.0, 3.0],
                       tokens=[8, 8, 8], padded_tokens=[8, 8, 8], warmup_steps=1)
  snap = m.snapshot()  # the fourth step's loss is in, its window's mark not yet
  assert snap.losses == [5.0, 4.0, 3.0] and snap.tokens == [8, 8]
  m.completion_times.append(4.0)
  assert snap.completion_times == [1.0, 2.0, 3.0]  # a copy
