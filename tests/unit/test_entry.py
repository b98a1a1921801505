"""tf_tput/entry.py: how every entry point starts: help exits 0, a bad flag value is one
line, and the frameworks' own log lines are left out unless asked for."""

import logging
import os

import pytest

from tf_tput import entry


def test_help_exits_0_and_a_bad_flag_value_is_one_line_exit_2(capsys):
  """absl's own help exits 1, as for an error; every entry point starts through
  entry.start, whose parser this is."""
  from absl import app, flags
  app.define_help_flags()
  if "errors_test_steps" not in flags.FLAGS:
    flags.DEFINE_integer("errors_test_steps", 1, "A flag of this test.")
  for argv in (["prog", "--help"], ["prog", "--helpfull"], ["prog", "-?"]):
    with pytest.raises(SystemExit) as ended:
      entry._parse_flags(argv)
    assert ended.value.code == 0, argv
  assert "--errors_test_steps" in capsys.readouterr().out
  with pytest.raises(SystemExit) as ended:
    entry._parse_flags(["prog", "--errors_test_steps=abc"])
  assert ended.value.code == 2
  [line] = capsys.readouterr().err.splitlines()
  assert line.startswith("error: ") and "abc" in line and line.endswith("see --helpshort")



def test_framework_lines_are_left_out_unless_asked_and_errors_always_pass(monkeypatch):
  monkeypatch.delenv(entry.CPP_LOG_LEVEL, raising=False)
  keep = entry._OwnLinesAndErrors()

  def line(path, level):
    return logging.LogRecord("absl", level, path, 1, "m", None, None)
  # A checkout named tf_tput with the frameworks in its .venv: their path holds the
  # word, and is still not tf_tput's.
  mtf = os.path.join(os.sep, "home", "u", "tf_tput", ".venv", "lib", "site-packages",
                     "mesh_tensorflow", "ops.py")
  own = os.path.join(entry.PACKAGE_DIR, "train.py")
  assert not keep.filter(line(mtf, logging.WARNING))
  assert keep.filter(line(mtf, logging.ERROR)) and keep.filter(line(own, logging.INFO))
  entry.quiet_frameworks(framework_logs=True)
  assert entry.CPP_LOG_LEVEL not in os.environ
  monkeypatch.setenv(entry.CPP_LOG_LEVEL, "0")  # the user's own setting wins
  handler = logging.Handler()  # not absl's own: other tests log through it
  monkeypatch.setattr(entry.absl_logging, "get_absl_handler", lambda: handler)
  entry.quiet_frameworks(framework_logs=False)
  assert os.environ[entry.CPP_LOG_LEVEL] == "0"
  assert [type(f) for f in handler.filters] == [entry._OwnLinesAndErrors]
