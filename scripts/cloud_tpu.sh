#!/usr/bin/env bash
# A full Cloud TPU run of the TF baseline: create a TPU VM, install tf_tput on it, run a
# suite (or one tf_tput.train command) with --strategy=tpu --tpu=local, copy the
# results back, delete the VM. NOT exercised by CI or on this project's machines (no
# TPU, no GCP credentials there); --dry_run prints every command instead of running it.
#
#   scripts/cloud_tpu.sh --project=my-proj --zone=us-central1-a --name=tf-tput-v3 \
#       --accelerator_type=v3-8 --suite=gin/suites/table1_paper.gin
#
# Every value is a flag (see usage below); nothing is read from the environment.
set -euo pipefail

usage() {
  cat >&2 <<'USAGE'
usage: scripts/cloud_tpu.sh --project=P --zone=Z [flags]
  --project=P            GCP project (required)
  --zone=Z               GCP zone with TPU quota (required), e.g. us-central1-a
  --name=N               TPU VM name (default tf-tput)
  --accelerator_type=T   e.g. v3-8, v4-8 (default v3-8)
  --runtime_version=V    TPU VM image (default tpu-vm-tf-2.16.1-pjrt)
  --tf_tpu_version=V     tensorflow-tpu wheel to install (default 2.16.1)
  --suite=FILE           gin suite to run with tf_tput.suite (default gin/suites/table1_paper.gin)
  --train_args="..."     run one tf_tput.train with these arguments instead of a suite
  --results_dir=DIR      where the results are copied back (default results/cloud_tpu)
  --keep                 keep the TPU VM afterwards (default: delete it)
  --dry_run              print the commands, run nothing
USAGE
}

project="" zone="" name="tf-tput" accelerator_type="v3-8"
runtime_version="tpu-vm-tf-2.16.1-pjrt" tf_tpu_version="2.16.1"
suite="gin/suites/table1_paper.gin" train_args="" results_dir="results/cloud_tpu"
keep=0 dry_run=0
for arg in "$@"; do
  case "$arg" in
    --project=*) project="${arg#*=}" ;;
    --zone=*) zone="${arg#*=}" ;;
    --name=*) name="${arg#*=}" ;;
    --accelerator_type=*) accelerator_type="${arg#*=}" ;;
    --runtime_version=*) runtime_version="${arg#*=}" ;;
    --tf_tpu_version=*) tf_tpu_version="${arg#*=}" ;;
    --suite=*) suite="${arg#*=}" ;;
    --train_args=*) train_args="${arg#*=}" ;;
    --results_dir=*) results_dir="${arg#*=}" ;;
    --keep) keep=1 ;;
    --dry_run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$arg'; see scripts/cloud_tpu.sh --help" >&2; exit 2 ;;
  esac
done
for required in project zone; do
  if [ -z "${!required}" ]; then
    echo "error: --$required is required, e.g. --$required=$([ $required = zone ] \
      && echo us-central1-a || echo my-gcp-project)" >&2
    exit 2
  fi
done

run() {  # prints, and runs unless --dry_run
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [ "$dry_run" = 0 ]; then "$@"; fi
}

repo="$(cd "$(dirname "$0")/.." && pwd)"
where=(--zone="$zone" --project="$project")
remote_results="results/cloud_tpu.jsonl"  # under ~/tf_tput on the VM
if [ -n "$train_args" ]; then
  workload="python -m tf_tput.train --strategy=tpu --tpu=local $train_args --results=$remote_results"
else
  workload="python -m tf_tput.suite --suite=$suite --results=$remote_results --train_flag=--tpu=local"
fi
# tf_tput's setup.py asks for tensorflow-cpu; on the TPU VM it is swapped for the
# tensorflow-tpu wheel that matches the image's libtpu.
install="cd tf_tput && python3 -m venv .venv && . .venv/bin/activate \
&& pip install -q -e . && pip uninstall -q -y tensorflow-cpu \
&& pip install -q tensorflow-tpu==$tf_tpu_version \
-f https://storage.googleapis.com/libtpu-tf-releases/index.html"

run gcloud compute tpus tpu-vm create "$name" "${where[@]}" \
  --accelerator-type="$accelerator_type" --version="$runtime_version"
cleanup() {
  if [ "$keep" = 0 ]; then
    run gcloud compute tpus tpu-vm delete "$name" "${where[@]}" --quiet
  fi
}
trap cleanup EXIT
run tar -C "$repo" --exclude=.venv --exclude=results --exclude=.git -czf /tmp/tf_tput.tgz .
run gcloud compute tpus tpu-vm scp /tmp/tf_tput.tgz "$name":tf_tput.tgz "${where[@]}"
run gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" \
  --command="mkdir -p tf_tput && tar -C tf_tput -xzf tf_tput.tgz && $install"
status=0
run gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" \
  --command="cd tf_tput && . .venv/bin/activate && mkdir -p results && $workload" || status=$?
run mkdir -p "$results_dir"
run gcloud compute tpus tpu-vm scp "$name":"tf_tput/$remote_results" \
  "$results_dir/$name-$(date -u +%Y%m%dT%H%M%SZ).jsonl" "${where[@]}"
exit $status
