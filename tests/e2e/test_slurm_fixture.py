"""The `slurm` fixture's cluster is real: srun runs tasks, mpirun ranks, and a batch
job's exit code comes back (tests/slurm_cluster.py)."""

import os
import subprocess


def test_srun_runs_two_tasks(slurm):
  proc = slurm.srun(["-n", "2", "sh", "-c", "echo task $SLURM_PROCID"], timeout=30)
  assert proc.returncode == 0, proc.stderr
  assert sorted(proc.stdout.split()) == ["0", "1", "task", "task"], proc.stdout


def test_mpirun_runs_two_ranks(slurm):
  proc = subprocess.run(slurm.mpirun_command(2, ["sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK"]),
                        env=dict(os.environ, **slurm.env()), capture_output=True,
                        text=True, timeout=30)
  assert proc.returncode == 0, proc.stderr
  assert sorted(proc.stdout.split()) == ["0", "1", "rank", "rank"], proc.stdout


def test_a_batch_job_s_exit_code_comes_back(slurm, tmp_path):
  script = tmp_path / "job.sh"
  script.write_text("#!/bin/sh\necho ran as job $SLURM_JOB_ID\nexit 3\n")
  job = slurm.sbatch(str(script), cwd=str(tmp_path))
  assert slurm.wait_job(job, timeout=30) == (3, "FAILED")
  assert open(slurm.output_path(job)).read() == f"ran as job {job}\n"
  assert str(job) not in slurm.jobs()
