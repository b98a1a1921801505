"""Shared by every test directory (pytest puts this directory on sys.path)."""

import time

import pytest

import process_checks


@pytest.fixture
def no_leftover_processes(monkeypatch):
  """Marks this test's environment; fails the test if a process it started survives."""
  mark = process_checks.new_mark()
  monkeypatch.setenv(process_checks.MARK, mark)
  since = time.time() - 1.0  # create_time has the kernel's tick resolution
  yield mark
  left = process_checks.left_running(since, mark)
  assert not left, f"processes still running after the test: {left}"
