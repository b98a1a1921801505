r"""What the shared measured loop costs: its tokens/s vs a bare loop of the same steps.

    python -m tf_tput.overhead --systems=mtf,jax --gin_file=t5_tiny \
        --steps=50 --rounds=5

Each system's trainer is built once on 1 device and its batches are built before
any timing. Each round runs the shared loop (measure/loop.py, 1 warmup step + --steps
measured) and a bare loop (one warmup step, then `for b in batches: trainer.step(b)`
between two perf_counter reads), in alternating order; the medians over rounds and
the overhead (1 - shared / bare) are printed, with the range of the rounds' own
overheads: on a busy machine that noise can exceed the loop's cost. The target is
<= 2%; it is printed, not asserted. The loop's own host cost per step, timed around
a no-op trainer, is printed too: the load of a shared machine barely moves it.
"""

import dataclasses
import itertools
import statistics
import time

from absl import flags

from tf_tput import config, data, entry, errors, systems
from tf_tput.measure import loop, metrics
from tf_tput.errors import UsageError

FLAGS = flags.FLAGS
flags.DEFINE_list("systems", ["mtf", "jax"], f"Systems to measure: {', '.join(systems.REGISTRY)}.")
flags.DEFINE_multi_string("gin_file", ["t5_tiny"], "Gin file (repeatable): a file "
                          "name such as t5_tiny, or a path.")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_integer("steps", 50, "Measured steps per loop and round.")
flags.DEFINE_integer("rounds", 5, "Rounds of (shared loop, bare loop).")

TARGET_PERCENT = 2.0


@dataclasses.dataclass(frozen=True)
class OverheadRequest:
  """What the flags ask, read once in main(); the flags above hold each one's default
  and help."""
  systems: tuple
  gin_file: tuple
  gin_param: tuple
  steps: int
  rounds: int


def bare_tokens_per_sec(trainer, batches: list) -> float:
  """One warmup step, then the rest timed with nothing but trainer.step around them."""
  trainer.step(batches[0])
  start = time.perf_counter()
  for batch in batches[1:]:
    trainer.step(batch)
  seconds = time.perf_counter() - start
  return metrics.tokens_per_sec(sum(data.count_tokens(b)[0] for b in batches[1:]), seconds)


def shared_tokens_per_sec(trainer, batches: list) -> float:
  m = loop.run(trainer, iter(batches), steps=len(batches) - 1, warmup_steps=1,
               log_every=len(batches))
  if m.error:
    raise RuntimeError(m.error)
  return metrics.tokens_per_sec(sum(m.tokens), m.measured_seconds)


def overhead_percent(shared: float, bare: float) -> float:
  return 100.0 * (1.0 - shared / bare)


def measure(trainer, batches: list, rounds: int) -> tuple:
  """(median shared tokens/s, median bare tokens/s, overhead % of the medians,
  [overhead % of each round]) over `rounds`; the rounds' spread is the noise."""
  shared, bare = [], []
  for r in range(rounds):
    order = ((shared, shared_tokens_per_sec), (bare, bare_tokens_per_sec))
    for figures, fn in (order if r % 2 == 0 else order[::-1]):
      figures.append(fn(trainer, batches))
  s, b = statistics.median(shared), statistics.median(bare)
  return s, b, overhead_percent(s, b), [overhead_percent(*p) for p in zip(shared, bare, strict=True)]


class _NoOpTrainer(systems.Trainer):
  """A step that does nothing: the loop around it is all that is timed."""

  def step(self, batch) -> float:
    return 0.0


def loop_cost_s(batches: list, rounds: int) -> float:
  """Median host seconds the shared loop adds per step, over a no-op trainer: a
  figure the machine's load barely moves, unlike the difference of two tokens/s."""
  trainer, costs = _NoOpTrainer(), []
  tokens = sum(data.count_tokens(b)[0] for b in batches[1:])
  for _ in range(rounds):
    shared, bare = (tokens / fn(trainer, batches)
                    for fn in (shared_tokens_per_sec, bare_tokens_per_sec))
    costs.append((shared - bare) / (len(batches) - 1))
  return statistics.median(costs)


def _checked(request: OverheadRequest):
  for name in request.systems:
    systems.check_name(name)
  for name, value in (("steps", request.steps), ("rounds", request.rounds)):
    if value < 1:
      raise UsageError(f"--{name}={value}; it must be >= 1")
  experiment = config.load_experiment(request.gin_file, request.gin_param,
                                      systems.options(*request.systems))
  config.validate(experiment, num_devices=1)
  for name in request.systems:
    systems.check_experiment(name, experiment)
  return experiment


def run(request: OverheadRequest) -> int:
  experiment = _checked(request)
  steps, rounds = request.steps, request.rounds
  batches = list(itertools.islice(data.batches(experiment, count=steps + 1), steps + 1))
  cost = loop_cost_s(batches, rounds)
  print(f"{experiment.model.name}, 1 device, {experiment.model.activation_dtype}: shared "
        f"loop vs bare loop, medians of {rounds} round(s) of {steps} steps")
  for name in request.systems:
    system = systems.load(name)
    trainer = system.build(experiment, system.runtime.resolve())
    try:
      shared, bare, overhead, per_round = measure(trainer, batches, rounds)
    finally:
      trainer.close()
    step_s = sum(data.count_tokens(b)[0] for b in batches[1:]) / steps / bare
    print(f"{name}: shared loop {shared:,.1f} tokens/s, bare loop {bare:,.1f} tokens/s, "
          f"overhead {overhead:+.2f}% (target <= {TARGET_PERCENT:g}%; rounds "
          f"{min(per_round):+.1f}% .. {max(per_round):+.1f}%); the loop's own cost "
          f"{1e6 * cost:.1f} us/step = {100 * cost / step_s:.3f}% of a step", flush=True)
  return 0


def main(argv) -> int:
  request = OverheadRequest(systems=tuple(FLAGS.systems), gin_file=tuple(FLAGS.gin_file),
                            gin_param=tuple(FLAGS.gin_param), steps=FLAGS.steps,
                            rounds=FLAGS.rounds)
  return errors.run_entry_point(lambda: run(request), argv)


if __name__ == "__main__":
  entry.start(main)
