#!/usr/bin/env bash
# Runs the test suite in .venv (created and installed on first use). Extra arguments
# go to pytest, e.g. scripts/test.sh -k results -x
TF_TPUT_EXTRAS="test,jax,ray"
source "$(dirname "$0")/_venv.sh"
# One worker per core, at most 4 (each may hold a TF or JAX process of a few GiB);
# much of the suite waits on child processes, so two workers on two cores still
# finish sooner. Tests that share host state (network namespaces) name an
# xdist_group and run in one worker. TF_TPUT_TEST_WORKERS=0 runs without xdist.
workers="${TF_TPUT_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadgroup)
fi
exec .venv/bin/python -m pytest tests "${parallel[@]}" "$@"
