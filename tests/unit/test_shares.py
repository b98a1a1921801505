"""tf_tput/suite/shares.py: an array task's share of a suite and its claims (the real
job array: tests/e2e/test_cluster_launchers.py)."""

import dataclasses

import pytest

from tf_tput.errors import UsageError
from tf_tput.suite import shares


def _env(task, low=0, high=2, count=3, step=None, job="57") -> dict:
  env = {"SLURM_ARRAY_JOB_ID": job, "SLURM_ARRAY_TASK_ID": str(task),
         "SLURM_ARRAY_TASK_MIN": str(low), "SLURM_ARRAY_TASK_MAX": str(high),
         "SLURM_ARRAY_TASK_COUNT": str(count)}
  if step is not None:
    env["SLURM_ARRAY_TASK_STEP"] = str(step)
  return env


def test_an_array_task_is_its_place_in_the_range():
  assert shares.array_task({}) is None
  assert shares.array_task(_env(1)) == shares.ArrayTask("57", 1, 0, 2, 1, 3)
  assert shares.array_task(_env(1)).index == 1
  assert shares.array_task(_env(14, low=10, high=20, count=6, step=2)).index == 2
  assert shares.array_task(_env(1)).name == "57_1"


def test_incomplete_variables_are_one_error():
  with pytest.raises(UsageError, match="incomplete"):
    shares.array_task({"SLURM_ARRAY_TASK_ID": "1"})


def test_an_array_that_is_not_a_range_has_no_share_but_may_claim():
  task = shares.array_task(_env(3, low=1, high=7, count=3))  # --array=1,3,7
  assert task.name == "57_3"  # enough for its claims under --share=all
  with pytest.raises(UsageError, match="are not one range"):
    shares.share([0, 1, 2], task, "s")


def test_each_task_takes_every_nth_run_and_none_is_left_out_or_taken_twice():
  runs = list(range(7))
  taken = [shares.share(runs, shares.ArrayTask("57", i, 0, 2, 1, 3), "s") for i in range(3)]
  assert taken == [[0, 3, 6], [1, 4], [2, 5]]


def test_a_task_beyond_the_suite_is_one_error_that_says_how_many_to_submit():
  with pytest.raises(UsageError, match=r"suite s has 2 run\(s\).*--array=0-1"):
    shares.share([0, 1], shares.ArrayTask("57", 2, 0, 2, 1, 3), "s")


@dataclasses.dataclass(frozen=True)
class Run:
  key: str
  label: str


RUNS = [Run("k0", "run zero"), Run("k1", "run one")]


def test_claims_are_taken_kept_across_a_requeue_and_released(tmp_path, monkeypatch):
  monkeypatch.setattr(shares, "_alive", lambda name: True)
  mine = shares.Claims(str(tmp_path / "c"), shares.ArrayTask("57", 0, 0, 1, 1, 2))
  mine.claim_all(RUNS)
  assert (tmp_path / "c" / "k0").read_text() == "57_0\n"
  mine.claim_all(RUNS)  # the same task again, requeued
  mine.release(RUNS[0])
  assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["k1"]


def test_a_run_a_live_task_holds_is_refused_and_nothing_stays_claimed(tmp_path,
                                                                       monkeypatch):
  monkeypatch.setattr(shares, "_alive", lambda name: True)
  shares.Claims(str(tmp_path), shares.ArrayTask("57", 1, 0, 1, 1, 2)).claim_all(RUNS[1:])
  other = shares.Claims(str(tmp_path), shares.ArrayTask("60", 0, 0, 0, 1, 1))
  with pytest.raises(UsageError, match="'run one' is claimed by array task 57_1"):
    other.claim_all(RUNS)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["k1"]  # k0 given back
  other.release(RUNS[1])  # not its claim: left alone
  assert (tmp_path / "k1").read_text() == "57_1\n"


def test_a_claim_of_a_task_that_is_gone_is_taken_over(tmp_path, monkeypatch):
  monkeypatch.setattr(shares, "_alive", lambda name: False)
  (tmp_path / "k0").write_text("57_1\n")
  shares.Claims(str(tmp_path), shares.ArrayTask("60", 0, 0, 0, 1, 1)).claim_all(RUNS)
  assert (tmp_path / "k0").read_text() == "60_0\n"
