"""scripts/cloud_tpu.sh: every value a flag; --dry_run shows the whole run, in order."""

import subprocess

from cli_helpers import REPO, error_lines

SCRIPT = str(REPO / "scripts" / "cloud_tpu.sh")


def _run(*args):
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_a_dry_run_creates_installs_runs_copies_back_and_deletes():
  proc = _run("--project=proj", "--zone=europe-west4-a", "--name=vm1",
              "--accelerator_type=v4-8", "--suite=gin/suites/table1_paper.gin",
              "--results_dir=out", "--dry_run")
  assert proc.returncode == 0, proc.stderr
  commands = [line for line in proc.stdout.splitlines() if line.startswith("+ ")]
  steps = [" ".join(c.split()[1:6]) for c in commands]
  assert steps[0] == "gcloud compute tpus tpu-vm create"
  assert "--accelerator-type=v4-8" in commands[0] and "--project=proj" in commands[0]
  assert any("tensorflow-tpu" in c for c in commands)
  [workload] = [c for c in commands if "tf_tput.suite" in c]
  assert "--train_flag=--tpu=local" in workload and "table1_paper.gin" in workload
  assert any("tpu-vm scp vm1:tf_tput/results/cloud_tpu.jsonl out/" in c for c in commands)
  assert commands[-1].startswith("+ gcloud compute tpus tpu-vm delete vm1")


def test_keep_leaves_the_vm():
  proc = _run("--project=p", "--zone=z", "--keep", "--dry_run")
  assert proc.returncode == 0 and "tpu-vm delete" not in proc.stdout


def test_missing_and_unknown_flags_are_one_clear_line():
  for args, expect in ((("--zone=z",), "--project is required"),
                       (("--project=p", "--zone=z", "--tpu_name=x"),
                        "unknown argument '--tpu_name=x'")):
    proc = _run(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert error_lines(proc.stderr) == [proc.stderr.strip()] and expect in proc.stderr
