"""How every entry point starts (start): under absl's app, with three changes.

- Help (--help, --helpfull, ...) exits 0; absl exits 1, as for an error.
- A flag value absl cannot parse (--steps=abc) is one error line and exit 2, as every
  other bad request (errors.UsageError).
- The frameworks' own console lines are left out unless --framework_logs: their C++
  notices (TF_CPP_MIN_LOG_LEVEL, where the environment does not set it) and their
  Python warnings (mesh_tensorflow's initializer notes, one per variable) hide
  tf_tput's own lines; their errors always pass.
"""

import logging
import os
import sys

from absl import app, flags, logging as absl_logging

FLAGS = flags.FLAGS
flags.DEFINE_bool("framework_logs", False, "Let the frameworks' own log lines through to "
                  "the console: TF and XLA's C++ notices and their Python warnings "
                  "(tf_tput's own lines and every error always pass).")

HELP_FLAGS = ("--help", "-help", "-?", "--helpshort", "--helpfull", "--helpxml")
CPP_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"  # TF and XLA's C++ logging: 2 keeps errors only


def _parse_flags(argv):
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"error: {' '.join(str(e).split())}; see --helpshort", file=sys.stderr)
    sys.exit(2)
  except SystemExit as e:
    asked = any(arg.split("=")[0] in HELP_FLAGS for arg in argv[1:])
    sys.exit(0 if asked and e.code == 1 else e.code)


# tf_tput's own modules: this package's directory (a checkout is often named tf_tput
# too, with the frameworks in its .venv, so a path's words would not tell).
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _OwnLinesAndErrors(logging.Filter):
  """Python log records of tf_tput's modules, and every error."""

  def filter(self, record: logging.LogRecord) -> bool:
    return (record.levelno >= logging.ERROR
            or os.path.abspath(record.pathname).startswith(PACKAGE_DIR))


def quiet_frameworks(framework_logs: bool) -> None:
  """Before any framework loads: its notices off unless asked for (its children, a
  launcher's processes, inherit the environment)."""
  if framework_logs:
    return
  os.environ.setdefault(CPP_LOG_LEVEL, "2")
  absl_logging.get_absl_handler().addFilter(_OwnLinesAndErrors())


def start(main) -> None:
  """Runs an entry point's main(argv) under absl."""
  def quiet_then_main(argv):
    quiet_frameworks(FLAGS.framework_logs)
    return main(argv)
  app.run(quiet_then_main, flags_parser=_parse_flags)
