#!/usr/bin/env bash
# The default benchmark, within 5 minutes on a 2-core VM from a fresh clone: the Mesh
# TensorFlow baseline (mtf), the JAX adapter (jax), TF2 (tf2) and PyTorch (torch),
# batch 8, lengths 128/128, on
#   t5_tiny  4 virtual CPU devices as a 2x2 mesh (dispatch- and partitioning-bound;
#            mtf and jax: tf2's strategies replicate, they have no model axis),
#            10 measured steps, in float32 and bfloat16
#   t5_small 1 device (matmul-bound), all four, 3 measured steps (their step times
#            vary by a few percent), in float32; BENCH_FULL=1 adds bfloat16 (~1.5
#            minutes more)
# bfloat16 runs only where the CPU multiplies bfloat16 natively (AMX / AVX-512 BF16):
# elsewhere TF's bfloat16 step is ~10x its float32 one (BENCH_BFLOAT16=1 runs it
# anyway). Prints what it ran, then one table with each system's tokens/s relative to
# mtf ("vs mtf"); the records go to results/bench-<time>.jsonl. Extra arguments go to
# every run, e.g. --steps=5.
TF_TPUT_EXTRAS="test,jax,torch"
source "$(dirname "$0")/_venv.sh"
out="results/bench-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
mkdir -p results
native_bf16="$(.venv/bin/python -c \
  'from tf_tput.records import provenance; print(",".join(provenance.native_bfloat16()))')"
bfloat16=0
if [ -n "$native_bf16" ] || [ "${BENCH_BFLOAT16:-0}" = 1 ]; then
  bfloat16=1
  echo "bfloat16: included (native bfloat16 matmuls: ${native_bf16:-none, forced by BENCH_BFLOAT16=1})" >&2
else
  echo "bfloat16: skipped: this CPU has no native bfloat16 matmul instructions (no amx_bf16 or" \
       "avx512_bf16 in /proc/cpuinfo), where TF's bfloat16 step is ~10x its float32 step" \
       "(docs/systems.md, 'bfloat16 on CPUs'); BENCH_BFLOAT16=1 runs it anyway" >&2
fi
status=0 ran=()
# model, mesh file, virtual devices, measured steps, warmup steps, dtypes, systems
while read -r model mesh devices steps warmup dtypes systems; do
  [ "$bfloat16" = 1 ] || dtypes="${dtypes//,bfloat16/}"
  ran+=("$(printf '%-9s %d device(s) (%s), %d steps after %d warmup: %s; %s' "$model" \
           "$devices" "$mesh" "$steps" "$warmup" "${dtypes//,/, }" "${systems//,/, }")")
  for dtype in ${dtypes//,/ }; do
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
done <<RUNS
t5_tiny data2_model2 4 10 2 float32,bfloat16 mtf,jax
t5_small single 1 3 1 float32$([ "${BENCH_FULL:-0}" = 1 ] && echo ,bfloat16) mtf,jax,tf2,torch
RUNS
echo
echo "bench.sh ran, batch 8, lengths 128/128 (arguments to every run, which override" \
     "these: ${*:-none}):"
printf '  %s\n' "${ran[@]}"
if [ "$bfloat16" = 1 ] && [ "${BENCH_FULL:-0}" != 1 ]; then
  echo "  (t5_small in bfloat16 too: BENCH_FULL=1, about 1.5 minutes more)"
fi
echo
.venv/bin/python -m tf_tput.report --results="$out"
echo "records: $out"
exit $status
