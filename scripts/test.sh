#!/usr/bin/env bash
# Runs the test suite in .venv (created and installed on first use), after
# scripts/lint.sh (ruff check). Extra arguments go to pytest and skip the lint, e.g.
# scripts/test.sh -k results -x
TF_TPUT_EXTRAS="test,jax,ray,pathways"
source "$(dirname "$0")/_venv.sh"
# One worker per core, at most 4 (each may hold a TF or JAX process of a few GiB);
# much of the suite waits on child processes, so two workers on two cores still
# finish sooner. Tests that share host state (network namespaces, loopback ports)
# name an xdist_group and run in one worker; tests marked `alone` (TF's gRPC
# micro-benchmarks, which load breaks) run afterwards by themselves
# (tests/conftest.py). With arguments, or TF_TPUT_TEST_WORKERS=1, one plain pytest.
workers="${TF_TPUT_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
whole=1  # the whole suite (no argument but -q): lint it first; a finding fails it
for arg in "$@"; do
  [ "$arg" = "-q" ] || whole=0
done
[ "$whole" = 1 ] && scripts/lint.sh
plain=0  # one pytest run: one worker, or a selection of tests
[ "$workers" -le 1 ] || [ "$whole" = 0 ] && plain=1
if [ "$plain" = 1 ]; then
  parallel=()
  [ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadgroup)
  exec .venv/bin/python -m pytest tests "${parallel[@]}" "$@"
fi
status=0
.venv/bin/python -m pytest tests -n "$workers" --dist loadgroup -m "not alone" "$@" || status=$?
.venv/bin/python -m pytest tests -m alone "$@" || status=$((status ? status : $?))
exit "$status"
