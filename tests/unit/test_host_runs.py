"""runtime/host_runs.py: which other runs were live on this host while a run ran
(the record's concurrent_runs), with real processes holding the locks."""

import ast
import os
import subprocess
import sys

from tf_tput.runtime import host_runs

# A run in a process of its own: registers, says so, then lives until stdin closes.
_RUN = ("import sys; from tf_tput.runtime import host_runs\n"
        "live = host_runs.LiveRun(sys.argv[1], sys.argv[2]).register()\n"
        "print('live', flush=True); sys.stdin.read(); print(live.others()); live.close()")


def _start(run_id: str, directory) -> subprocess.Popen:
  proc = subprocess.Popen([sys.executable, "-c", _RUN, run_id, str(directory)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "live\n"
  return proc


def _end(proc: subprocess.Popen) -> list:
  out, _ = proc.communicate(timeout=30)
  return ast.literal_eval(out)  # the list of run ids it printed


def test_runs_whose_lives_overlap_list_each_other_and_later_ones_do_not():
  directory = os.path.join(os.environ[host_runs.LIVE_DIR_ENV], "overlap")
  first = _start("aaaaaaaaaaaa", directory)
  second = _start("bbbbbbbbbbbb", directory)  # finds the first, and tells it
  assert _end(first) == ["bbbbbbbbbbbb"]
  third = _start("cccccccccccc", directory)  # the first has gone
  assert _end(second) == ["aaaaaaaaaaaa", "cccccccccccc"]
  assert _end(third) == ["bbbbbbbbbbbb"]
  assert os.listdir(directory) == []  # each removed its own file


def test_processes_of_one_run_are_one_run_and_a_killed_run_s_file_is_stale(tmp_path):
  worker = _start("aaaaaaaaaaaa", tmp_path)  # another process of the same run
  killed = _start("dddddddddddd", tmp_path)
  killed.kill()
  killed.wait()
  live = host_runs.LiveRun("aaaaaaaaaaaa", str(tmp_path)).register()
  assert live.others() == []
  assert sorted(os.listdir(tmp_path)) == sorted([f"aaaaaaaaaaaa.{os.getpid()}",
                                                 f"aaaaaaaaaaaa.{worker.pid}"])  # stale gone
  live.close()
  _end(worker)


def test_a_run_that_cannot_register_says_nothing_of_others(tmp_path):
  blocked = tmp_path / "file"
  blocked.write_text("")  # a file where the directory should be
  live = host_runs.LiveRun("aaaaaaaaaaaa", str(blocked / "live")).register()
  assert live.others() == []
  live.close()
