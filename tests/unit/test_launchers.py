"""runtime/launchers.py: each launcher's variables as that launcher sets them, nested
launchers, and the variables that disagree (one line each, before any framework)."""

import json

import pytest

from tf_tput.errors import UsageError
from tf_tput.runtime import launchers, processes

# As `srun -n 2` sets them in task 1 (Slurm 22.05; values from a real step here).
SLURM_TASK_1 = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURMD_NODENAME": "vm"}
TORCHRUN_RANK_1 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "run-7"}
MPIRUN_RANK_0 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                 "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911"}


def test_nothing_set_is_one_process_started_by_hand():
  assert launchers.detect({}) == launchers.Launch()
  assert launchers.detect({}).launcher is None


def test_slurm_task_has_its_rank_size_job_and_jax_s_coordinator():
  launch = launchers.detect(SLURM_TASK_1)
  assert (launch.launcher, launch.num_processes, launch.process_id,
          launch.local_process_id, launch.local_num_processes, launch.job_id) == (
              "slurm", 2, 1, 1, 2, "41")
  # JAX's SlurmCluster: the first node, port 41 % 4096 + 61440
  assert launch.coordinator == "vm:61481" and launch.hosts == ("vm",)


def test_sbatch_script_is_one_process_of_its_job():
  launch = launchers.detect({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "4"})
  assert (launch.launcher, launch.num_processes, launch.job_id) == ("slurm", 1, "9")


def test_torchrun_store_is_its_own_and_the_coordinator_the_next_port():
  launch = launchers.detect(TORCHRUN_RANK_1)
  assert (launch.launcher, launch.num_processes, launch.process_id, launch.job_id) == (
      "torchrun", 2, 1, "run-7")
  assert launch.store == "127.0.0.1:29500" and launch.coordinator == "127.0.0.1:29501"


def test_mpirun_coordinator_is_jax_s_from_the_hnp_uri():
  launch = launchers.detect(MPIRUN_RANK_0)
  # JAX's OmpiCluster: mpirun's first address, port (job // 4096) % 4096 + 61440
  assert launch.coordinator == f"10.96.0.1:{(1531576320 // 4096) % 4096 + 61440}"
  assert (launch.launcher, launch.num_processes, launch.job_id) == (
      "mpirun", 2, "1531576320")


def test_tf_launch_and_tf_config_tasks():
  launch = launchers.detect({processes.NUM_PROCESSES_ENV: "2",
                             processes.PROCESS_ID_ENV: "1",
                             processes.COORDINATOR_ENV: "127.0.0.1:5000",
                             "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                                      "task": {"type": "worker",
                                                               "index": 1}})})
  assert (launch.launcher, launch.process_id, launch.coordinator) == (
      "tf_tput.launch", 1, "127.0.0.1:5000")
  worker = launchers.detect({"TF_CONFIG": json.dumps(
      {"cluster": {"chief": ["c:1"], "worker": ["a:1", "b:2"]},
       "task": {"type": "worker", "index": 1}})})
  assert (worker.launcher, worker.num_processes, worker.process_id) == ("tf_config", 3, 2)


@pytest.mark.parametrize("inner", [TORCHRUN_RANK_1, MPIRUN_RANK_0])
def test_a_launcher_inside_a_slurm_step_is_the_one_that_started_the_process(inner):
  launch = launchers.detect({**SLURM_TASK_1, **inner})
  assert launch.launcher in ("torchrun", "mpirun")
  assert launch.num_processes == 2


def test_a_slurm_job_lends_its_id_to_a_launcher_without_one():
  launch = launchers.detect({**SLURM_TASK_1, processes.NUM_PROCESSES_ENV: "1",
                             processes.PROCESS_ID_ENV: "0"})
  assert (launch.launcher, launch.job_id) == ("tf_tput.launch", "41")


@pytest.mark.parametrize("environ, named", [
    ({**TORCHRUN_RANK_1, **MPIRUN_RANK_0}, ["torchrun (process 1 of 2)",
                                            "mpirun (process 0 of 2)"]),
    ({**SLURM_TASK_1, "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                               "task": {"type": "worker", "index": 0}})},
     ["tf_config (process 0 of 2)", "slurm (process 1 of 2)"]),
    ({**SLURM_TASK_1, "SLURM_NTASKS": "4"}, ["SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=2"]),
    ({"RANK": "0", "WORLD_SIZE": "2"}, ["RANK=0", "MASTER_ADDR"]),
    ({**TORCHRUN_RANK_1, "RANK": "2"}, ["RANK and WORLD_SIZE = 2 of 2"]),
    ({**TORCHRUN_RANK_1, "WORLD_SIZE": "two"}, ["WORLD_SIZE='two'"]),
    ({**MPIRUN_RANK_0, "OMPI_MCA_orte_hnp_uri": ""}, ["Open MPI 5"]),
])
def test_variables_that_disagree_are_one_line_naming_both(environ, named):
  with pytest.raises(UsageError) as raised:
    launchers.detect(environ)
  message = str(raised.value)
  assert "\n" not in message
  for text in named:
    assert text in message


def test_slurm_host_lists_and_task_counts_expand_in_order():
  assert launchers.expand_hostlist("node[01-03,07],login1,gpu[9-10]b") == (
      "node01", "node02", "node03", "node07", "login1", "gpu9b", "gpu10b")
  assert launchers.expand_counts("2(x3),1") == (2, 2, 2, 1)


def test_the_tasks_of_one_slurm_step_share_a_run_id_and_other_steps_do_not():
  task_0 = {**SLURM_TASK_1, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
  ids = {launchers.detect(environ).run_id for environ in (SLURM_TASK_1, task_0)}
  assert len(ids) == 1 and len(next(iter(ids))) == 12
  others = [{**SLURM_TASK_1, "SLURM_STEP_ID": "1"}, {**SLURM_TASK_1, "SLURM_JOB_ID": "42"},
            {**SLURM_TASK_1, "SLURM_RESTART_COUNT": "1"}]  # a requeued job's step 0
  assert len(ids | {launchers.detect(environ).run_id for environ in others}) == 4


def test_a_run_id_the_launcher_gives_wins_and_a_malformed_one_is_one_line():
  given = {processes.RUN_ID_ENV: "0123456789ab"}
  assert launchers.detect(given).run_id == "0123456789ab"
  assert launchers.detect({**SLURM_TASK_1, **given}).run_id == "0123456789ab"
  assert launchers.detect({}).run_id is None  # the run makes one
  with pytest.raises(UsageError, match="TF_TPUT_RUN_ID='run-1' is not a run id"):
    launchers.detect({processes.RUN_ID_ENV: "run-1"})


def test_an_array_task_is_named_inside_an_inner_launcher_too():
  array = {"SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}
  for environ in ({**SLURM_TASK_1, **array}, {**SLURM_TASK_1, **array, **TORCHRUN_RANK_1},
                  {"SLURM_JOB_ID": "41", **array}):
    launch = launchers.detect(environ)
    assert (launch.array_job_id, launch.array_task_id) == ("40", 3)
  assert launchers.detect(SLURM_TASK_1).array_job_id is None


@pytest.mark.parametrize("environ, allocation, room", [
    ({"SLURM_JOB_CPUS_PER_NODE": "1"}, (1, 1, False), 1),  # an array task's default
    ({"SLURM_JOB_CPUS_PER_NODE": "4(x2),2", "SLURM_CPUS_PER_TASK": "2"}, (10, 2, False), 5),
    ({"SLURM_JOB_CPUS_PER_NODE": "1", "SLURM_OVERCOMMIT": "1"}, (1, 1, True), None),
])
def test_a_slurm_job_s_allocation_says_how_many_tasks_a_step_may_have(environ, allocation,
                                                                      room):
  found = launchers.slurm_allocation(environ)
  assert (found.cpus, found.cpus_per_task, found.overcommit) == allocation
  assert found.max_step_tasks == room
  assert launchers.slurm_allocation({}) is None
