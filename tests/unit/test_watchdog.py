"""tf_tput/runtime/watchdog.py: the bound on a window and the words of an ending (the
signals and the hung steps themselves: tests/e2e/test_interrupted_runs.py)."""

import signal

from tf_tput.measure import loop
from tf_tput.runtime import processes, watchdog


def test_the_first_window_compiles_and_gets_an_hour_unless_the_flag_gives_more():
  assert watchdog.window_bound([], None) == watchdog.FIRST_WINDOW_S
  assert watchdog.window_bound([], 10.0) == watchdog.FIRST_WINDOW_S
  assert watchdog.window_bound([], 7200.0) == 7200.0


def test_later_windows_get_the_flag_else_a_multiple_of_the_slowest_after_the_first():
  assert watchdog.window_bound([120.0, 0.5], 10.0) == 10.0
  assert watchdog.window_bound([120.0, 0.5, 30.0], None) == watchdog.FACTOR * 30.0
  assert watchdog.window_bound([120.0, 0.5], None) == watchdog.FLOOR_S  # the floor
  assert watchdog.window_bound([40.0], None) == watchdog.FACTOR * 40.0  # only the first


def test_an_interrupted_ending_names_the_signal_and_how_far_the_run_got():
  m = loop.Measurement(losses=[3.0, 2.0, 1.0], tokens=[8, 8], warmup_steps=1)
  ending = watchdog.interrupted(signal.SIGTERM, watchdog.progress(m, "train"))
  assert ending.status == "interrupted" and ending.signal == "SIGTERM"
  assert ending.exit_code == 143
  assert ending.error == "SIGTERM after 3 step(s), 2 of them measured"
  before = watchdog.progress(loop.Measurement(), "build")
  assert watchdog.interrupted(signal.SIGHUP, before).error == (
      "SIGHUP in its build, before any step")


def test_a_signal_after_the_launcher_names_a_failed_peer_ends_the_run_as_that_failure(
    tmp_path, monkeypatch):
  monkeypatch.setenv(processes.HEARTBEAT_DIR_ENV, str(tmp_path))
  guard = watchdog.Watchdog(lambda ending, from_thread: 0, None)
  guard._heartbeat = str(tmp_path / "0")  # as install() sets it under tf_tput.launch
  guard.signum = signal.SIGTERM
  m = loop.Measurement(losses=[3.0, 2.0], tokens=[8], warmup_steps=1)
  assert guard.signal_ending(m, "train").status == "interrupted"  # nothing said
  (tmp_path / processes.STOP_REASON_FILE).write_text("process 1 (pid 7) was killed by "
                                                     "signal 9\n")
  ending = guard.signal_ending(m, "train")
  assert (ending.status, ending.signal, ending.exit_code) == ("failed", None, 1)
  assert ending.error == ("step 2: process 1 (pid 7) was killed by signal 9, and "
                          "tf_tput.launch stopped this process (SIGTERM, stage train)")


def test_a_run_that_does_not_stop_in_time_is_said_to_wait_on_a_peer_only_with_peers():
  build = watchdog.why_stuck("build", 1)
  assert build == (" (it did not stop within 3 s: building the trainer, in the "
                   "framework's graph construction or compilation, which returns to "
                   "Python only when done)")
  assert watchdog.why_stuck("build", 4) == build  # a build waits on no peer
  for stage in ("devices", "train", "trace", "peak probe", "start"):
    assert "peer" not in watchdog.why_stuck(stage, 1), stage
  assert "collective whose peer has gone" in watchdog.why_stuck("train", 2)
  assert "other processes" in watchdog.why_stuck("devices", 2)
  assert watchdog.why_stuck("peak probe", 1).endswith(
      "in its peak probe, a call that has not returned to Python)")


def test_a_stuck_run_is_recorded_with_its_stage_and_process_count():
  def stuck(stage, num_processes):
    guard = watchdog.Watchdog(lambda ending, from_thread: 0, None, num_processes=num_processes,
                              progress=lambda: (loop.Measurement(), stage))
    guard.signum = signal.SIGINT
    return guard._stuck_interrupt().error

  assert stuck("build", 1) == (
      "SIGINT in its build, before any step (it did not stop within 3 s: building the "
      "trainer, in the framework's graph construction or compilation, which returns "
      "to Python only when done)")
  assert stuck("train", 2).endswith("blocked in a step, e.g. in a collective whose peer "
                                    "has gone)")


def test_the_run_ends_once_inside_the_context_and_the_handlers_come_back():
  """`with Watchdog(...) as guard:` installs the handlers and the thread; guard.end
  writes the ending here, once (the thread can no longer claim it); leaving the block
  puts the handlers back as they were."""
  before = {sig: signal.getsignal(sig) for sig in watchdog.SIGNALS}
  endings = []
  with watchdog.Watchdog(lambda ending, from_thread: endings.append(
      (ending, from_thread)) or 7, None, num_processes=1) as guard:
    assert all(signal.getsignal(sig) == guard._on_signal for sig in watchdog.SIGNALS)
    assert guard.end(None, "train") == 7
    assert not guard.claim()  # the ending is taken
  assert endings == [(None, False)]
  assert {sig: signal.getsignal(sig) for sig in watchdog.SIGNALS} == before
