#!/usr/bin/env bash
# Runs the test suite in .venv (created and installed on first use). Extra arguments
# go to pytest, e.g. scripts/test.sh -k results -x
TF_TPUT_EXTRAS="test,jax,ray"
source "$(dirname "$0")/_venv.sh"
exec .venv/bin/python -m pytest tests "$@"
