#!/usr/bin/env bash
# The GPU benchmark, for a machine lent one NVIDIA GPU (docs/measurement.md, "On a
# GPU"): T5 Base in bfloat16 on one GPU, lengths 128/128, 20 measured steps after 3
# warmup, at the largest global batch whose planned bytes per device fit in 60% of the
# GPU's memory (tf_tput.plan --fit_memory_gib: parameters, Adafactor slots and the
# activation estimate; not found by trial). 60%: the plan said 56.9 GB for batch 512,
# where jax's peak was 79.6 GB on an H200 (docs/results/2026-12-04-h200-t5-base-jax.md).
#   jax    embedding gather, then one_hot
#   torch  eager, then compiled (TorchOptions.compile = True)
# mtf and tf2 need TensorFlow, which the lent machines do not have: run where it is
# installed, else skipped and said so. Every record goes to results/gpu-<time>.jsonl,
# then one table (tf_tput.report) with MFU against the GPU's dense bfloat16 peak.
#
#   scripts/gpu.sh [--dry_run] [--memory_gib=N] [arguments for every run]
#   scripts/gpu.sh --build_wheelhouse     (on a machine with network; see below)
#
# It uses the machine's Python ($PYTHON, else python3) and the JAX and PyTorch
# installed there (CUDA builds; .venv's are CPU builds), with this checkout on
# PYTHONPATH; a system whose framework that Python lacks is skipped and said so.
# What else the runs need (setup.py's "gpu" extra: absl-py, gin-config, optax, all
# pure Python) it installs where missing, without dependencies, into .gpu-deps/
# ($TF_TPUT_GPU_DEPS), also on PYTHONPATH, so the machine's own packages are never
# replaced: from PyPI, or from wheelhouse/ ($TF_TPUT_WHEELHOUSE) where that exists,
# for a machine with no network; --build_wheelhouse fills it on a machine with
# network, to copy along with the checkout. --dry_run prints the batch and the runs
# without starting them, on any machine (the tests run it on a CPU); --memory_gib
# stands in for the GPU's memory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DEPS="${TF_TPUT_GPU_DEPS:-$ROOT/.gpu-deps}"
WHEELHOUSE="${TF_TPUT_WHEELHOUSE:-$ROOT/wheelhouse}"
export PYTHONPATH="$ROOT:$DEPS${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
if ! "$PYTHON" -c "import sys; sys.exit(sys.version_info < (3, 10))" 2>/dev/null; then
  echo "error: PYTHON=$PYTHON is not a Python 3.10 or newer; set PYTHON to the one" \
       "with the machine's CUDA builds of jax and torch" >&2
  exit 2
fi

# setup.py's "gpu" requirements, read without setuptools (which may be absent); with
# --missing, those whose distribution this Python does not find.
gpu_requirements() {
  "$PYTHON" - "$@" <<'PY'
import importlib.metadata, re, runpy, sys, types
setuptools, found = types.ModuleType("setuptools"), {}
setuptools.setup, setuptools.find_packages = found.update, lambda **_: []
sys.modules["setuptools"] = setuptools
runpy.run_path("setup.py")
for requirement in found["extras_require"]["gpu"]:
  if "--missing" in sys.argv:
    try:
      importlib.metadata.distribution(re.match(r"[\w.-]+", requirement).group())
      continue
    except importlib.metadata.PackageNotFoundError:
      pass
  print(requirement)
PY
}

if [ "${1:-}" = "--build_wheelhouse" ]; then
  mapfile -t requirements < <(gpu_requirements)
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELHOUSE" \
    "${requirements[@]}"
  echo "wheelhouse: $WHEELHOUSE (${requirements[*]}); copy it with the checkout" >&2
  exit 0
fi
mapfile -t missing < <(gpu_requirements --missing)
if [ "${#missing[@]}" -gt 0 ]; then
  source=()
  [ -d "$WHEELHOUSE" ] && source=(--no-index "--find-links=$WHEELHOUSE")
  echo "installing ${missing[*]} into $DEPS${source:+ from $WHEELHOUSE}" >&2
  log="$(mktemp)"
  if ! "$PYTHON" -m pip install -q --no-deps --no-compile --target "$DEPS" \
       "${source[@]}" "${missing[@]}" > "$log" 2>&1; then
    why="$(grep -v '^[[:space:]]*$' "$log" | tail -1 | tr -s ' ' || true)"
    rm -f "$log"
    echo "error: $PYTHON lacks ${missing[*]} and pip could not install them into" \
         "$DEPS (${why:-no output}); with no network, run scripts/gpu.sh" \
         "--build_wheelhouse on a machine with one and copy wheelhouse/ here" >&2
    exit 2
  fi
  rm -f "$log"
fi
# JAX takes 75% of the GPU's memory by default; the planned batch may need more.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}"
dry_run=0 memory_gib="" args=()
for arg in "$@"; do
  case "$arg" in
    --dry_run) dry_run=1 ;;
    --memory_gib=*) memory_gib="${arg#--memory_gib=}" ;;
    *) args+=("$arg") ;;
  esac
done
if [ -z "$memory_gib" ]; then
  mib="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null \
         | head -1 || true)"
  if [ -z "$mib" ]; then
    echo "error: no NVIDIA GPU found (nvidia-smi lists none); on a machine without one," \
         "pass --dry_run --memory_gib=N to see what would run" >&2
    exit 2
  fi
  memory_gib="$(awk -v m="$mib" 'BEGIN { printf "%.1f", m / 1024 }')"
fi
fit_gib="$(awk -v m="$memory_gib" 'BEGIN { if (m + 0 <= 0) exit 1; printf "%.1f", 0.6 * m }')" || {
  echo "error: --memory_gib=$memory_gib is not a positive number of GiB, e.g. --memory_gib=80" >&2
  exit 2
}
model=(--gin_file=t5_base --gin_param="ModelConfig.activation_dtype = 'bfloat16'"
       --gin_param="DataConfig.inputs_length = 128" --gin_param="DataConfig.targets_length = 128")
# The plan says what went wrong in its own line, if anything does.
plan="$("$PYTHON" -m tf_tput.plan "${model[@]}" --fit_memory_gib="$fit_gib" --format=json)"
batch="$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["global_batch"])' \
         "$plan")"
echo "T5 Base, bfloat16, global batch $batch: the largest whose planned bytes per device" \
     "fit in $fit_gib GiB (60% of $memory_gib GiB)" >&2
# system|embedding|torch.compile (torch only)
runs=()  # module|its name|its runs, each system|embedding|torch.compile (torch only)
for framework in "jax|JAX|jax:gather: jax:one_hot:" \
                 "torch|PyTorch|torch:gather:False torch:gather:True" \
                 "tensorflow|TensorFlow|mtf:one_hot: tf2:gather:"; do
  IFS='|' read -r module name these <<< "$framework"
  # find_spec, not an import: TensorFlow's takes seconds, and a broken install fails
  # its run with the run's own error.
  if "$PYTHON" -c "import importlib.util, sys; sys.exit(not importlib.util.find_spec('$module'))"
  then
    runs+=($these)
  else
    systems="$(for run in $these; do printf '%s\n' "${run%%:*}"; done | uniq | paste -sd, - \
               | sed 's/,/, /g')"
    echo "$systems: skipped: $name is not installed for $PYTHON" >&2
  fi
done
if [ "${#runs[@]}" = 0 ] && [ "$dry_run" = 0 ]; then
  echo "error: $PYTHON has none of JAX, PyTorch and TensorFlow; set PYTHON to the" \
       "Python with the machine's CUDA builds of them" >&2
  exit 2
fi
out="results/gpu-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
status=0
for run in "${runs[@]}"; do
  IFS=: read -r system embedding compiled <<< "$run"
  bindings=(--gin_param="ModelConfig.embedding = '$embedding'")
  [ -n "$compiled" ] && bindings+=(--gin_param="TorchOptions.compile = $compiled")
  command=("$PYTHON" -m tf_tput.train --system="$system" "${model[@]}" "${bindings[@]}"
           --global_batch="$batch" --steps=20 --warmup_steps=3 --results="$out"
           "${args[@]}")
  if [ "$dry_run" = 1 ]; then
    printf 'would run:'; printf ' %q' "${command[@]}"; echo
    continue
  fi
  echo "== $system, embedding $embedding${compiled:+, torch.compile $compiled}" >&2
  mkdir -p results
  "${command[@]}" || status=1
done
[ "$dry_run" = 1 ] && exit 0
"$PYTHON" -m tf_tput.report --results="$out"
echo "records: $out"
exit $status
