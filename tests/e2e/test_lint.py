"""scripts/lint.sh (ruff check with .ruff.toml), which scripts/test.sh runs before the
tests: findings listed, one error line, exit 1."""

import subprocess

from cli_helpers import REPO, error_lines


def test_findings_are_listed_then_one_error_line_and_exit_1(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("import os\n\nfor a, b in zip([1], [2]):\n  print(a, b)\n"
                 "try:\n  pass\nexcept Exception:\n  pass\n")
  proc = subprocess.run([str(REPO / "scripts" / "lint.sh"), str(bad)], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 1, proc.stderr
  for code in ("F401", "B905", "BLE001"):  # pyflakes, a zip() without strict=, a blind except
    assert f"{bad}:" in proc.stderr and code in proc.stderr, proc.stderr
  [line] = error_lines(proc.stderr)
  assert line.startswith("error: ruff check found 3 problem(s)"), proc.stderr


def test_a_clean_file_passes_silently(tmp_path):
  good = tmp_path / "good.py"
  good.write_text("import itertools\n\nprint(list(itertools.pairwise([1, 2])))\n")
  proc = subprocess.run([str(REPO / "scripts" / "lint.sh"), str(good)], cwd=tmp_path,
                        capture_output=True, text=True, timeout=60)
  assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
