"""Startup: a run's seconds from its start to its first measured step, and the
compilation cache's outcome, as the tables show them and --compare judges them."""


def startup_s(r: dict):
  """Seconds from the run's start to its first measured step: build_s + warmup_s (the
  compile and the first step are inside warmup_s; docs/measurement.md, "Startup").
  None where a record lacks either (a failed run, a record older than the fields)."""
  build, warmup = r.get("build_s"), r.get("warmup_s")
  return None if build is None or warmup is None else build + warmup


def startup_cell(build_s, warmup_s, cache=None) -> str:
  """'build + warmup' seconds, with the compilation cache's hit, miss or mixed."""
  if build_s is None or warmup_s is None:
    return "-"
  return f"{build_s:.1f} + {warmup_s:.1f}" + (
      f" {cache}" if cache in ("hit", "miss", "mixed") else "")


def cache_outcome(runs: list):
  """The runs' compilation cache outcome: theirs where they agree, "mixed" where some
  hit and some missed (a median over both is neither a cold nor a warm start)."""
  outcomes = {r.get("compilation_cache") for r in runs}
  return outcomes.pop() if len(outcomes) == 1 else "mixed"
