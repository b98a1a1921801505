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
#
# It uses the machine's Python ($PYTHON, else python3) and the JAX and PyTorch
# installed there (CUDA builds; .venv's are CPU builds), with this checkout on
# PYTHONPATH. --dry_run prints the batch and the runs without starting them, on any
# machine (the tests run it on a CPU); --memory_gib stands in for the GPU's memory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
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
batch="$("$PYTHON" -m tf_tput.plan "${model[@]}" --fit_memory_gib="$fit_gib" --format=json \
         | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["global_batch"])')"
echo "T5 Base, bfloat16, global batch $batch: the largest whose planned bytes per device" \
     "fit in $fit_gib GiB (60% of $memory_gib GiB)" >&2
# system|embedding|torch.compile (torch only)
runs=("jax|gather|" "jax|one_hot|" "torch|gather|False" "torch|gather|True")
if "$PYTHON" -c "import tensorflow" 2>/dev/null; then
  runs+=("mtf|one_hot|" "tf2|gather|")
else
  echo "mtf, tf2: skipped: TensorFlow is not installed for $PYTHON" >&2
fi
out="results/gpu-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
status=0
for run in "${runs[@]}"; do
  IFS='|' read -r system embedding compiled <<< "$run"
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
