"""Which runs the tables hold, and what both reports say about runs below their
tables: partial runs, shared hosts, narrowed CPUs, job arrays."""

import collections

from tf_tput.records import results
from tf_tput.report import bands, configs
from tf_tput.runtime import cpus

# Statuses of runs that did not measure to the end: every table leaves them out and
# every report lists them below its tables.
PARTIAL_STATUSES = tuple(s for s in results.STATUSES if s != "ok")
PARTIAL_HEADING = f"{' and '.join(PARTIAL_STATUSES).capitalize()} runs (in no table)"
NO_OK_RUN = "no ok run"  # a table cell where every run of it was partial
ARRAYS_HEADING = "Slurm job arrays"
# How a run's host was shared while it measured -> what its mark means. Records from
# before concurrent_runs and packed lack them: not marked.
SHARING_NOTES = {
    "shared": "another tf_tput train run was live on the same host while it ran, "
              "unasked, so its tokens/s is likely low; rerun it alone",
    "packed": "it shared its host with other tf_tput train runs as asked (train "
              "--packed); its tokens/s is a shared host's",
}


def ok_runs(records: list) -> list:
  return [r for r in records if r["status"] == "ok"]


def partial_runs(records: list) -> list:
  """The records no table holds, in the order read."""
  return [r for r in records if r["status"] in PARTIAL_STATUSES]


def partial_line(r: dict) -> str:
  """What a partial run was, its status and why."""
  return (f"{r['model']} {r['system']} {configs.dtype_label(r)} {r['mesh_shape']} batch "
          f"{r['global_batch']} (run {r['run_id']}, {r['started_at']}): "
          f"{r['status']}: {r['error']}")


def status_counts(runs: list) -> str:
  """'2 ok, 1 interrupted': runs per status, in results.STATUSES order."""
  counts = collections.Counter(r["status"] for r in runs)
  return ", ".join(f"{counts[s]} {s}" for s in results.STATUSES if counts[s])


def sharing(r: dict):
  """The run's mark (a key of SHARING_NOTES) where other runs were live on its host,
  else None."""
  if not r.get("concurrent_runs"):
    return None
  return "packed" if r.get("packed") else "shared"


def cpus_note(r: dict):
  """runtime/cpus.py's line where the recording process ran on fewer CPUs than its
  host has (a launcher's binding); None where it had them all, or the record is older
  than env.cpu_affinity."""
  env = r.get("env", {})
  if "cpu_affinity" not in env:
    return None
  return cpus.narrowing_note(env["cpu_affinity"], env["cpu_count"], r.get("launcher"),
                             env.get("cpu_binding"))


def host_cell(r: dict) -> str:
  """The host column: shared or packed, and the CPUs where a launcher narrowed them."""
  env = r.get("env", {})
  narrowed = (f"{cpus.count(env['cpu_affinity'])} of {env['cpu_count']} CPUs"
              if cpus_note(r) else None)
  return ", ".join(filter(None, (sharing(r), narrowed)))


def sharing_notes(ok: list) -> list:
  """A footnote per mark the ok runs carry, naming the runs, and the line of each run
  whose CPUs were narrowed."""
  marked = bands.group([r for r in ok if sharing(r)], sharing)
  return [f"{mark}: {note} (run(s) {', '.join(r['run_id'] for r in marked[mark])})."
          for mark, note in SHARING_NOTES.items() if mark in marked] + [
              f"run {r['run_id']}: {cpus_note(r)}." for r in ok if cpus_note(r)]


def array_lines(records: list) -> list:
  """Per Slurm job array the records ran in, each task's runs by status:
  'array 14: task 0: 2 ok, 1 interrupted; task 1: 1 ok'. [] where none did."""
  in_arrays = [r for r in records if r.get("array_job_id")]
  lines = []
  for job, runs in bands.group(in_arrays, lambda r: r["array_job_id"]).items():
    by_task = bands.group(sorted(runs, key=lambda r: (r.get("array_task_id") is None,
                                                      r.get("array_task_id") or 0)),
                          lambda r: r.get("array_task_id"))
    lines.append(f"array {job}: " + "; ".join(
        f"task {'?' if task is None else task}: {status_counts(mine)}"
        for task, mine in by_task.items()))
  return lines
