"""The one exception type for bad user input."""


class UsageError(ValueError):
  """A problem with what the user asked for.

  The message is one line that names the offending value and how to fix it; entry
  points print it without a traceback and exit non-zero.
  """
