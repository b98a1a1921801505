"""BUILD names the real sources: every file it names exists, every module is named."""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def _named_files() -> set:
  text = (REPO / "BUILD").read_text()
  return set(re.findall(r'"((?:tf_tput|tests)/[\w/]+\.py)"', text))


def test_every_named_file_exists():
  named = _named_files()
  assert named, "BUILD names no Python files"
  missing = sorted(p for p in named if not (REPO / p).is_file())
  assert not missing, f"BUILD names files that do not exist: {missing}"


def test_every_module_and_test_is_named():
  on_disk = {str(p.relative_to(REPO)) for p in (REPO / "tf_tput").rglob("*.py")}
  on_disk |= {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")}
  unnamed = sorted(on_disk - _named_files())
  assert not unnamed, f"add these to BUILD: {unnamed}"
