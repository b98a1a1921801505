"""A joined Ray cluster's token variables (tf_tput/systems/torch/ray/auth.py), as the
installed Ray reads them: what is refused before a run, in one line, and what a
refused driver is told. The same against a real cluster: tests/e2e/test_ray_nodes.py."""

import os
import socket

import pytest

from tf_tput.errors import UsageError
from tf_tput.systems.torch.ray import auth

ADDRESS = "10.0.0.2:6379"


@pytest.fixture
def token_file(tmp_path):
  path = tmp_path / "ray_token"
  path.write_text("f00d\n")
  return str(path)


def _env(tmp_path, **variables) -> dict:
  """An environment whose HOME (and so ~/.ray/auth_token) is tmp_path's."""
  return {"HOME": str(tmp_path), **variables}


@pytest.mark.parametrize("variables", [
    {},                                                       # a private cluster
    {"RAY_AUTH_TOKEN_PATH": "{token}"},                       # ... whatever else is set
    {"RAY_ADDRESS": ADDRESS},                                 # a cluster without tokens
    {"RAY_ADDRESS": ADDRESS, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "{token}"},
    {"RAY_ADDRESS": ADDRESS, "RAY_AUTH_MODE": "TOKEN", "RAY_AUTH_TOKEN": "f00d"},
    {"RAY_ADDRESS": ADDRESS, "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "{token}"},
    {"RAY_ADDRESS": "auto", "RAY_AUTH_TOKEN_PATH": "{token}"},  # Ray turns tokens on
    {"RAY_ADDRESS": ADDRESS, "RAY_AUTH_TOKEN_PATH": ""},      # empty is unset, to Ray
])
def test_variables_ray_can_work_with_pass(tmp_path, token_file, variables):
  env = _env(tmp_path, **{k: v.format(token=token_file) for k, v in variables.items()})
  auth.check_env(env)


def test_token_mode_finds_the_token_in_the_home_directory(tmp_path):
  (tmp_path / ".ray").mkdir()
  (tmp_path / ".ray" / "auth_token").write_text("f00d")
  auth.check_env(_env(tmp_path, RAY_ADDRESS=ADDRESS, RAY_AUTH_MODE="token"))


@pytest.mark.parametrize("variables, expect", [
    ({"RAY_AUTH_TOKEN_PATH": "{token}"},
     "RAY_AUTH_TOKEN_PATH is set but RAY_AUTH_MODE is not: Ray sends no token to "
     f"RAY_ADDRESS={ADDRESS} without RAY_AUTH_MODE=token; set RAY_AUTH_MODE=token"),
    ({"RAY_AUTH_TOKEN": "f00d"}, "RAY_AUTH_TOKEN is set but RAY_AUTH_MODE is not"),
    ({"RAY_AUTH_MODE": "tokens"}, "RAY_AUTH_MODE='tokens': Ray knows 'token' and "
     "'disabled' and reads anything else as disabled; set RAY_AUTH_MODE=token"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "{missing}"},
     "RAY_AUTH_TOKEN_PATH={missing} holds no token (no such file, unreadable or empty); "
     "point it at the file holding the cluster's token"),
    ({"RAY_AUTH_MODE": "token"}, "RAY_AUTH_MODE=token but no token: set "
     "RAY_AUTH_TOKEN_PATH to the file holding the cluster's token (or copy it to "
     "{home}/.ray/auth_token)"),
])
def test_variables_ray_cannot_work_with_are_one_line_naming_the_fix(tmp_path, token_file,
                                                                    variables, expect):
  names = {"token": token_file, "missing": str(tmp_path / "nope"), "home": str(tmp_path)}
  env = _env(tmp_path, RAY_ADDRESS=ADDRESS,
             **{k: v.format(**names) for k, v in variables.items()})
  with pytest.raises(UsageError) as raised:
    auth.check_env(env)
  assert expect.format(**names) in str(raised.value)
  assert "\n" not in str(raised.value)


def test_a_refused_driver_is_told_what_ray_sent(tmp_path, token_file):
  unset = auth.refused(ADDRESS, _env(tmp_path))
  assert unset == (f"the Ray cluster at {ADDRESS} requires a token and RAY_AUTH_MODE "
                   "is unset, so Ray sent none: set RAY_AUTH_MODE=token and the "
                   "cluster's token (RAY_AUTH_TOKEN_PATH=its file, or "
                   f"{tmp_path}/.ray/auth_token)")
  assert "and RAY_AUTH_MODE=disabled, so Ray sent none" in auth.refused(
      ADDRESS, _env(tmp_path, RAY_AUTH_MODE="disabled"))
  wrong = auth.refused(ADDRESS, _env(tmp_path, RAY_AUTH_MODE="token",
                                     RAY_AUTH_TOKEN_PATH=token_file))
  assert wrong == (f"the Ray cluster at {ADDRESS} refused the token from "
                   f"RAY_AUTH_TOKEN_PATH={token_file}: set RAY_AUTH_TOKEN_PATH to the "
                   "file holding the token the cluster's nodes started with")


@pytest.mark.parametrize("address", ["auto", "ray://10.0.0.2:10001", "no-port",
                                     "127.0.0.1:{free}"])
def test_where_no_gcs_answers_ray_init_reports_as_before(address, monkeypatch):
  """No probe of the cluster (ray.init says what is wrong, as before), and no error."""
  pytest.importorskip("ray")
  from ray import _raylet
  probes = []

  class Client:  # records a probe instead of making one
    @staticmethod
    def standalone(*args, **kwargs):
      probes.append(args)
  monkeypatch.setattr(_raylet, "InnerGcsClient", Client)
  with socket.socket() as s:  # a port nothing listens on once closed
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
  auth.check_accepted(address.format(free=free))
  assert probes == []


def test_what_is_written_while_held_comes_out_after_unless_dropped(capfd):
  with auth._stderr_held():
    os.write(2, b"kept\n")
  with auth._stderr_held() as held:
    os.write(2, b"dropped\n")
    held["keep"] = False
  assert capfd.readouterr().err == "kept\n"
