"""The one exception type for bad user input, and the one way errors become one line."""

import sys


class UsageError(ValueError):
  """A problem with what the user asked for.

  The message is one line that names the offending value and how to fix it; entry
  points print it without a traceback and exit non-zero.
  """


# Characters of a failure's cause a record keeps (cause()); the log keeps everything.
CAUSE_LIMIT = 1000


def cause(error: BaseException, limit: int = CAUSE_LIMIT) -> str:
  """A failure as one line that keeps its cause: the type, the cause, then what led to
  it. Some errors put a stack first and the cause last (TensorFlow's "Graph execution
  error: Detected at node ... defined at (most recent call last): File ... OOM when
  allocating ..."): the stack's frames are left out, the cause goes first, and past
  the limit the end of the text is kept, not the start."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  frames = [i for i, line in enumerate(lines) if line.startswith('File "')]
  if frames:
    before, after = lines[:frames[0]], lines[frames[-1] + 1:]
    text = " ".join(after) + (f" (after: {' '.join(before)})" if before else "")
  else:
    text = " ".join(lines)
  text = " ".join(text.split())
  name = type(error).__name__
  if len(name) + 2 + len(text) > limit:
    text = "…" + text[-(limit - len(name) - 3):]
  return f"{name}: {text}"


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

