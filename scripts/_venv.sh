# Sourced by bench.sh and test.sh: cd to the repository, create or reuse .venv, and
# install the project (with the extras in $TF_TPUT_EXTRAS) only when setup.py changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "creating .venv with $($PYTHON --version)" >&2
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.tf_tput_installed"
want="$(cat setup.py | sha256sum | cut -d' ' -f1) extras=${TF_TPUT_EXTRAS}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing tf_tput[${TF_TPUT_EXTRAS}] into .venv (setup.py changed or first run)" >&2
  log=".venv/pip-install.log"
  if ! { .venv/bin/python -m pip install --upgrade pip \
         && .venv/bin/python -m pip install -e ".[${TF_TPUT_EXTRAS}]"; } > "$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -20 >&2
    echo "error: installing into .venv failed (full log: $ROOT/$log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
