#!/usr/bin/env bash
# What the single controller costs as a TF cluster grows. T5 tiny (MODEL=t5_small for
# the larger one) on one 2x2 mesh of 4 CPU devices, batch 8, lengths 128/128, the
# same work each time, run: as one local process (--strategy=local), then from a
# chief over 1, 2 and 4 loopback workers holding 4, 2 and 1 devices each
# (tf_tput.launch --num_workers, --strategy=multi_worker). Prints tokens/s and the
# step-time spread per worker count; the records go to results/scale-<time>.jsonl.
# Extra arguments go to every tf_tput.train run, e.g. scripts/scale_workers.sh --steps=5
TF_TPUT_EXTRAS="test,jax"
source "$(dirname "$0")/_venv.sh"
model="${MODEL:-t5_tiny}"
out="results/scale-$(date -u +%Y%m%dT%H%M%SZ).jsonl"
mkdir -p results
common=(--system=mtf --gin_file="gin/models/$model.gin" --gin_file=gin/mesh/data2_model2.gin
        --global_batch=8 --gin_param="DataConfig.inputs_length = 128"
        --gin_param="DataConfig.targets_length = 128" --steps=20 --warmup_steps=2
        --results="$out")
status=0
echo "== $model local, 4 devices in this process" >&2
.venv/bin/python -m tf_tput.train "${common[@]}" --num_cpu_devices=4 "$@" || status=1
for workers in 1 2 4; do
  echo "== $model multi_worker, $workers worker(s) x $((4 / workers)) device(s)" >&2
  .venv/bin/python -m tf_tput.launch --num_workers="$workers" \
    --devices_per_worker=$((4 / workers)) -- \
    .venv/bin/python -m tf_tput.train "${common[@]}" --strategy=multi_worker "$@" \
    || status=1
done
echo
.venv/bin/python - "$out" <<'PY'
import sys
from tf_tput import results
records, _ = results.read(sys.argv[1])
local = next((r["tokens_per_sec"] for r in records
              if r["strategy"] == "local" and r["status"] == "ok"), None)
print(f"{'strategy':<13}{'workers':>8}{'dev/worker':>11}{'tokens/s':>11}{'vs local':>9}"
      f"  step p10 / median / p90 (s)")
for r in records:
  workers = r["num_processes"] if r["strategy"] == "multi_worker" else 0
  per = r["env"]["accelerators"][0]["count"]
  st, tps = r["step_time_s"], r["tokens_per_sec"]
  ratio = f"{tps / local:.2f}x" if tps and local else "-"
  spread = (f"{st['p10']:.3f} / {st['median']:.3f} / {st['p90']:.3f}" if tps
            else f"failed: {r['error'][:60]}")
  print(f"{r['strategy']:<13}{workers or '-':>8}{per:>11}{tps or 0:>11,.0f}{ratio:>9}  "
        f"{spread}")
PY
echo "records: $out"
exit $status
