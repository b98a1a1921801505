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
stamp=".venv/.tf_tput_installed"  # "<sha256 of setup.py> extras=a,b,c" once installed
setup_hash="$(sha256sum setup.py | cut -d' ' -f1)"
installed_hash="" installed_extras=""
if [ -f "$stamp" ]; then
  read -r installed_hash installed_extras < "$stamp" || true
  installed_extras="${installed_extras#extras=}"
fi
# Keep every extra installed so far: scripts asking for fewer do not reinstall.
extras="$(printf '%s\n' ${TF_TPUT_EXTRAS//,/ } ${installed_extras//,/ } | sort -u | paste -sd, -)"
if [ "$installed_hash" != "$setup_hash" ] || [ "$extras" != "$installed_extras" ]; then
  echo "installing tf_tput[${extras}] into .venv (setup.py or the extras changed, or first run)" >&2
  log=".venv/pip-install.log"
  # No bytecode at install: pip compiles every module one file at a time (~30 s of
  # a 62 s install on 2 cores) and compileall -j 0 still took 24-26 s for 17,680
  # files, of which a run imports about 5,000. Python writes each one's bytecode
  # the first time a run imports it (below). pip >= 22.3: `pip --python`, which
  # tests/e2e/test_wheel_install.py uses.
  if ! { .venv/bin/python -m pip install -q "pip>=22.3" \
         && .venv/bin/python -m pip install --no-compile -e ".[${extras}]"
       } > "$log" 2>&1
  then
    grep -v "^WARNING: Location" "$log" | tail -20 >&2
    echo "error: installing into .venv failed (full log: $ROOT/$log)" >&2
    exit 1
  fi
  echo "$setup_hash extras=$extras" > "$stamp"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# Bytecode is written as modules are first imported (into .venv and the checkout's
# __pycache__/, both ours), even where the shell sets PYTHONDONTWRITEBYTECODE:
# without it every process would compile TF's, JAX's and torch's modules anew.
unset PYTHONDONTWRITEBYTECODE
