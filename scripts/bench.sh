#!/usr/bin/env bash
# The default benchmark: the Mesh TensorFlow baseline (mtf) and the JAX adapter (jax)
# on 4 virtual CPU devices (2x2 mesh), T5 tiny and small, batch 8, lengths 128/128,
# float32 and bfloat16. Prints one table with the JAX/TF ratio ("vs mtf");
# the records go to results/bench-<time>.jsonl.
# Extra arguments go to every tf_tput.train run, e.g. scripts/bench.sh --steps=5
TF_TPUT_EXTRAS="test,jax"
source "$(dirname "$0")/_venv.sh"
out="results/bench-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
mkdir -p results
status=0
for model in t5_tiny t5_small; do
  for dtype in float32 bfloat16; do
    for system in mtf jax; do
      echo "== $model $dtype $system" >&2
      .venv/bin/python -m tf_tput.train --system="$system" \
        --gin_file="gin/models/$model.gin" --gin_file=gin/mesh/data2_model2.gin \
        --gin_param="ModelConfig.activation_dtype = '$dtype'" \
        --global_batch=8 --gin_param="DataConfig.inputs_length = 128" \
        --gin_param="DataConfig.targets_length = 128" \
        --num_cpu_devices=4 --steps=10 --warmup_steps=2 --results="$out" "$@" \
        || status=1
    done
  done
done
echo
.venv/bin/python -m tf_tput.report --results="$out"
echo "records: $out"
exit $status
