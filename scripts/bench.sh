#!/usr/bin/env bash
# The default benchmark, a few minutes on 2 cores: the Mesh TensorFlow baseline (mtf),
# the JAX adapter (jax), TF2 (tf2) and PyTorch (torch), batch 8, lengths 128/128, on
#   t5_tiny  4 virtual CPU devices as a 2x2 mesh (dispatch- and partitioning-bound;
#            mtf and jax: tf2's strategies replicate, they have no model axis)
#   t5_small 1 device (matmul-bound), all four
# in float32, and in bfloat16 only where the CPU multiplies bfloat16 natively (AMX /
# AVX-512 BF16): elsewhere TF's bfloat16 step is ~10x its float32 one and would take
# most of the time (BENCH_BFLOAT16=1 runs it anyway). Prints one table with each
# system's tokens/s relative to mtf ("vs mtf"); the records go to
# results/bench-<time>.jsonl. Extra arguments go to every run, e.g. --steps=3.
TF_TPUT_EXTRAS="test,jax,torch"
source "$(dirname "$0")/_venv.sh"
out="results/bench-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
mkdir -p results
native_bf16="$(.venv/bin/python -c \
  'from tf_tput.records import provenance; print(",".join(provenance.native_bfloat16()))')"
dtypes="float32"
if [ -n "$native_bf16" ] || [ "${BENCH_BFLOAT16:-0}" = 1 ]; then
  dtypes="float32 bfloat16"
  echo "bfloat16: included (native bfloat16 matmuls: ${native_bf16:-none, forced by BENCH_BFLOAT16=1})" >&2
else
  echo "bfloat16: skipped: this CPU has no native bfloat16 matmul instructions (no amx_bf16 or" \
       "avx512_bf16 in /proc/cpuinfo), where TF's bfloat16 step is ~10x its float32 step" \
       "(docs/systems.md, 'bfloat16 on CPUs'); BENCH_BFLOAT16=1 runs it anyway" >&2
fi
status=0
# model, mesh file, virtual devices, measured steps, warmup steps, systems
while read -r model mesh devices steps warmup systems; do
  for dtype in $dtypes; do
    for system in ${systems//,/ }; do
      echo "== $model $dtype $system" >&2
      .venv/bin/python -m tf_tput.train --system="$system" \
        --gin_file="$model" --gin_file="$mesh" \
        --gin_param="ModelConfig.activation_dtype = '$dtype'" \
        --global_batch=8 --gin_param="DataConfig.inputs_length = 128" \
        --gin_param="DataConfig.targets_length = 128" \
        --num_cpu_devices="$devices" --steps="$steps" --warmup_steps="$warmup" \
        --results="$out" "$@" || status=1
    done
  done
done <<'RUNS'
t5_tiny data2_model2 4 10 2 mtf,jax
t5_small single 1 5 1 mtf,jax,tf2,torch
RUNS
echo
.venv/bin/python -m tf_tput.report --results="$out"
echo "records: $out"
exit $status
