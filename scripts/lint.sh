#!/usr/bin/env bash
# ruff check with the project's rules (.ruff.toml) over the Python files, or the
# paths given; its findings, then one error line, and exit 1 when there are any.
# scripts/test.sh runs it before the tests; it expects .venv (test.sh makes it).
set -uo pipefail
cd "$(dirname "$0")/.."
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(setup.py tf_tput tests scripts)
if ! out="$(.venv/bin/ruff check --config .ruff.toml --no-cache --output-format=concise "${paths[@]}" 2>&1)"; then
  printf '%s\n' "$out" | grep -v "^Found \|fixable with" >&2
  count="$(printf '%s\n' "$out" | grep -c ':[0-9]*:[0-9]*: ')"
  echo "error: ruff check found $count problem(s) (listed above, rules in .ruff.toml);" \
       "fix them, or where a rule is wrong for a line say why in its '# noqa: CODE - reason'" >&2
  exit 1
fi
