"""Ray's token authentication as a driver that joins a cluster meets it.

RAY_AUTH_MODE, RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH are Ray's own variables, read
here as Ray 2.60's source reads them (a Ray without them has no AuthenticationError,
and check_accepted() then does nothing):
  - RAY_AUTH_MODE: 'token' (in any case) sends and checks tokens; anything else,
    unset included, is 'disabled'. Unset, Ray turns tokens on by itself only for
    `ray start --head` and for RAY_ADDRESS=auto, where it finds a token; a node or a
    driver given an address sends none. So a head started beside a token (even the
    ~/.ray/auth_token a local ray.init leaves) asks for one that its other nodes and
    its drivers send only under RAY_AUTH_MODE=token.
  - the token: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names (which must
    hold one: Ray does not fall back), else ~/.ray/auth_token. Empty is unset.

check_env() refuses before the run what the environment already shows is wrong;
check_accepted() asks the cluster once before ray.init, which on a refused token
tries 20 times a second apart, a warning each, and ends in a stack trace.
"""

import contextlib
import os
import socket
import sys
import tempfile
from typing import Optional

from tf_tput.errors import UsageError

ADDRESS = "RAY_ADDRESS"
MODE = "RAY_AUTH_MODE"
TOKEN = "RAY_AUTH_TOKEN"
TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
MODES = ("token", "disabled")      # Ray's; it reads any other value as disabled
PROBE_TIMEOUT_S = 5.0              # a GCS that accepts connections answers in ms


def default_token_file(env) -> str:
  """~/.ray/auth_token, as Ray finds it (HOME)."""
  return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".ray", "auth_token")


def token_source(env) -> Optional[str]:
  """Where Ray takes this process's token from, in its order, or None."""
  if env.get(TOKEN):
    return TOKEN
  if env.get(TOKEN_PATH):
    return f"{TOKEN_PATH}={env[TOKEN_PATH]}"
  path = default_token_file(env)
  return path if os.path.isfile(path) else None


def check_env(env=os.environ) -> None:
  """Where the run joins a cluster (RAY_ADDRESS set): UsageError in one line where
  the authentication variables contradict each other or name no token."""
  address, mode = env.get(ADDRESS), env.get(MODE)
  if not address:
    return
  if mode is not None and mode.lower() not in MODES:
    raise UsageError(f"{MODE}={mode!r}: Ray knows 'token' and 'disabled' and reads "
                     f"anything else as disabled; set {MODE}=token for a cluster that "
                     "uses tokens")
  given = TOKEN if env.get(TOKEN) else TOKEN_PATH if env.get(TOKEN_PATH) else None
  # Unset, Ray would send no token to an address it is given (auto aside); an explicit
  # 'disabled' is the user's word, as Ray takes it.
  if mode is None and given and address != "auto":
    raise UsageError(f"{given} is set but {MODE} is not: Ray sends no token to "
                     f"{ADDRESS}={address} without {MODE}=token; set {MODE}=token (as where "
                     f"the cluster's nodes started), or unset {given} for a cluster "
                     "without tokens")
  if mode is not None and mode.lower() == "token":
    _check_token(env)


def _check_token(env) -> None:
  """Under RAY_AUTH_MODE=token, a token where Ray looks for one."""
  path = env.get(TOKEN_PATH)
  if env.get(TOKEN) or (path and _holds_token(path)):
    return
  if path:
    raise UsageError(f"{TOKEN_PATH}={path} holds no token (no such file, unreadable or "
                     "empty); point it at the file holding the cluster's token")
  if not os.path.isfile(default_token_file(env)):
    raise UsageError(f"{MODE}=token but no token: set {TOKEN_PATH} to the file holding "
                     f"the cluster's token (or copy it to {default_token_file(env)})")


def _holds_token(path: str) -> bool:
  try:
    with open(path, encoding="utf-8") as f:
      return bool(f.read().strip())
  except (OSError, UnicodeDecodeError):
    return False


def refused(address: str, env=os.environ) -> str:
  """What to fix, in one line, once the cluster at address refused this process."""
  mode = env.get(MODE)
  if (mode or "").lower() != "token":
    said = f"{MODE}={mode}" if mode is not None else f"{MODE} is unset"
    return (f"the Ray cluster at {address} requires a token and {said}, so Ray sent "
            f"none: set {MODE}=token and the cluster's token ({TOKEN_PATH}=its file, or "
            f"{default_token_file(env)})")
  return (f"the Ray cluster at {address} refused the token from {token_source(env)}: "
          f"set {TOKEN_PATH} to the file holding the token the cluster's nodes started "
          "with")


def check_accepted(address: str) -> None:
  """Asks the GCS at address once whether it accepts this process: UsageError in one
  line (refused()) where it does not. Where nothing accepts a connection within
  PROBE_TIMEOUT_S, the address is not host:port, or Ray has no token authentication
  (before 2.5x), ray.init goes on as without this."""
  import ray
  rejection = getattr(ray.exceptions, "AuthenticationError", None)
  if rejection is None or not _accepts_connections(address):
    return
  with _stderr_held() as held:
    try:
      from ray._raylet import InnerGcsClient
      InnerGcsClient.standalone(address, cluster_id=None,
                                timeout_ms=int(PROBE_TIMEOUT_S * 1000))
    except rejection:
      held["keep"] = False  # Ray's own warning of it: the error line says it
      raise UsageError(refused(address)) from None
    except Exception:  # noqa: BLE001 - anything else is ray.init's to report, as before
      pass


def _accepts_connections(address: str) -> bool:
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or "/" in host:
    return False  # auto, ray://..., or no port: Ray resolves those itself
  try:
    with socket.create_connection((host.strip("[]"), int(port)), PROBE_TIMEOUT_S):
      return True
  except OSError:
    return False


@contextlib.contextmanager
def _stderr_held():
  """Holds what is written to fd 2 (Ray's C++ client logs there) and writes it out at
  the end, unless the caller sets ["keep"] to False."""
  sys.stderr.flush()
  held, saved = {"keep": True}, os.dup(2)
  with tempfile.TemporaryFile() as kept:
    os.dup2(kept.fileno(), 2)
    try:
      yield held
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      if held["keep"]:
        kept.seek(0)
        os.write(2, kept.read())
