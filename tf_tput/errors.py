"""The one exception type for bad user input, and the one way errors become one line."""

import sys


class UsageError(ValueError):
  """A problem with what the user asked for.

  The message is one line that names the offending value and how to fix it; entry
  points print it without a traceback and exit non-zero.
  """


def one_line(error: BaseException, limit: int = 500) -> str:
  """An exception as one line: its type and its message, whitespace collapsed."""
  return f"{type(error).__name__}: {' '.join(str(error).split())}"[:limit]


def run_entry_point(body, argv) -> int:
  """Runs an entry point's body: stray arguments and UsageError give one line, exit 2."""
  if len(argv) > 1:
    print(f"error: unexpected arguments {argv[1:]}; flags take the form --name=value",
          file=sys.stderr)
    return 2
  try:
    return body()
  except UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
