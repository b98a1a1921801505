"""Result records: the schema, atomic JSON-lines append, and tolerant reading.

Records are only appended, never rewritten: one line under an exclusive lock, so a
crash cannot corrupt earlier lines; a write that fails part-way is cut back off, and a
line left without its newline by an earlier crash is closed before the next record.
The lock is fcntl's (POSIX, which NFS clients carry to the server), and the line goes
at the end the lock holder reads, not through O_APPEND: on NFS, O_APPEND is not atomic
across hosts, so tasks of a job array appending to one file on a shared filesystem
would otherwise overwrite each other's lines.
"""

import fcntl
import json
import math
import os
import pathlib
import sys
import tempfile
from typing import Optional

from tf_tput.errors import UsageError

SCHEMA = "tf_tput.result/1"

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))
# field -> accepted types. The order is the order records are written in.
# synchronous_step: the trainer's step returns only when done (None: never built).
FIELDS = {
    "schema": str, "run_id": str, "started_at": str, "status": str, "error": _OPT_STR,
    "system": str, "strategy": str, "model": str, "arch": str, "num_params": int,
    "mesh_shape": str, "layout": str, "num_devices": int, "num_processes": int,
    # How it was started (runtime/launchers.py): tf_tput.launch, torchrun, slurm,
    # mpirun, tf_config, or None (by hand); the launcher's job id where it has one.
    "launcher": _OPT_STR, "job_id": _OPT_STR,
    # The Slurm job array task it ran in (SLURM_ARRAY_JOB_ID, _TASK_ID); None outside.
    "array_job_id": _OPT_STR, "array_task_id": (int, type(None)),
    # Other tf_tput runs live on process 0's host while it ran (runtime/host_runs.py),
    # and whether the user asked for that (train's --packed).
    "concurrent_runs": list, "packed": bool,
    # Where it ran: the distinct nodes its workers (the processes holding its devices)
    # ran on, sorted (docs/records.md says how each runtime names them), and how many;
    # [] and 0 where the devices never resolved.
    "nodes": list, "num_nodes": int,
    "global_batch": int, "inputs_length": (int, type(None)), "targets_length": int,
    "dtype": str, "embedding": str,
    # How the system ran the config beyond its arithmetic (systems.variant: its
    # options' non-default values, scanned layers); None: its default way.
    "variant": _OPT_STR,
    # What the system says a reader must know of this run (systems.caveat: e.g. a path
    # tf_tput never exercised); None: nothing.
    "caveat": _OPT_STR,
    # A pipeline (tf_tput/pipeline.py): 1 stage, 1 micro-batch and schedule None when
    # there is none; bubble_fraction is the theoretical (S-1)/(M+S-1).
    "pipeline_stages": int, "micro_batches": int, "schedule": _OPT_STR,
    "bubble_fraction": _NUM,
    # Across tf_tput.launch --islands=K (runtime/islands.py): K (1: one island on
    # loopback, the same hierarchical reduction), 0 and None without --islands;
    # link bytes: sent between islands per measured step, counted on the links and as
    # the hierarchical reduction predicts.
    "islands": int, "devices_per_island": int, "dcn_rate": _OPT_STR,
    "link_bytes_per_step": _OPT_NUM, "link_bytes_per_step_analytic": _OPT_NUM,
    "steps": int, "warmup_steps": int, "sync_every": int,
    "synchronous_step": (bool, type(None)),
    # Startup (docs/measurement.md): seconds; null where the run did not get there,
    # compile_s also where the trainer does not compile ahead of time.
    # compilation_cache: "hit", "miss", "off", or null where the runtime has none.
    "build_s": _OPT_NUM, "compile_s": _OPT_NUM, "first_step_s": _OPT_NUM,
    "warmup_s": _OPT_NUM, "compilation_cache": _OPT_STR,
    "step_time_s": dict,
    "tokens_per_step": (int, type(None)), "padded_tokens_per_step": (int, type(None)),
    "tokens_per_sec": _OPT_NUM, "padded_tokens_per_sec": _OPT_NUM,
    "model_flops_per_token": _NUM, "model_tflops_per_sec": _OPT_NUM,
    "peak_flops_per_device": _OPT_NUM, "peak_source": str, "mfu": _OPT_NUM,
    "peak_host_memory_bytes": (int, type(None)), "device_memory_bytes": (int, type(None)),
    # The measured steps completed (fewer than steps when the run did not finish), the
    # seconds of each measured window (sync_every steps), and the signal that ended an
    # interrupted run (SIGTERM, SIGINT, SIGHUP; else None).
    "steps_measured": int, "window_s": list, "signal": _OPT_STR,
    "losses": list, "final_loss": _OPT_NUM, "config": str, "flags": dict, "env": dict,
    "git_commit": _OPT_STR,
    "run_key": str,  # tf_tput.records.keys.run_key: what a suite resumes by
}
STEP_TIME_KEYS = ("median", "mean", "p10", "p90", "min", "max")
# What every record's env holds; it also holds the version of each registered system's
# libraries (System.distributions: tensorflow, mesh_tensorflow, jax, ...; None when
# not installed), which records of a system added later lack.
ENV_KEYS = ("python", "numpy", "platform", "cpu", "accelerators")
# interrupted: a signal ended the run (runtime/watchdog.py); what it measured is kept,
# never counted as a result.
STATUSES = ("ok", "failed", "interrupted")
COMPILATION_CACHE = ("hit", "miss", "off")  # and None: the system's runtime has none

# Dispatch micro-benchmark records (tf_tput.micro); computations counted per repeat.
MICRO_SCHEMA = "tf_tput.micro/1"
MICRO_FIELDS = {
    "schema": str, "run_id": str, "started_at": str, "status": str, "error": _OPT_STR,
    "system": str, "mode": str, "hosts": int, "devices_per_host": int,
    "chain_length": int, "computations": int, "matmul_n": int,
    # computation_ms: the requested duration of the crossover's matmul; _measured:
    # the median time of that size's matmul here (tf_tput/micro/sizing.py).
    "computation_ms": _OPT_NUM, "computation_ms_measured": _OPT_NUM, "wall_s": _OPT_NUM,
    "computations_per_sec": _OPT_NUM,
    "repeats": list, "env": dict, "git_commit": _OPT_STR,
    "run_key": str,  # tf_tput.records.keys.micro_run_key
}
# skipped: the system's extra is not installed; not_applicable: the system has no
# such mode (JAX has no chained mode, as in the paper). `error` says which and why.
MICRO_STATUSES = ("ok", "failed", "skipped", "not_applicable")

# Fields added to a schema after records were written without them: new records must
# have them; a record read back may lack them (written by older code), and then the
# field is left out of it, never guessed. Readers use record.get(field). A record
# without run_key matches no suite run, so a suite measures it again.
LATER_FIELDS = {
    SCHEMA: ("embedding", "run_key", "sync_every", "synchronous_step", "pipeline_stages",
             "micro_batches", "schedule", "bubble_fraction", "islands",
             "devices_per_island", "dcn_rate", "link_bytes_per_step",
             "link_bytes_per_step_analytic", "build_s", "compile_s", "first_step_s",
             "warmup_s", "compilation_cache", "variant", "caveat", "nodes",
             "num_nodes", "launcher", "job_id", "steps_measured", "window_s", "signal",
             "array_job_id", "array_task_id", "concurrent_runs", "packed"),
    MICRO_SCHEMA: ("run_key", "computation_ms_measured"),
}

# schema -> (fields, statuses, fields an ok record must have)
_KINDS = {
    SCHEMA: (FIELDS, STATUSES, ("tokens_per_sec", "final_loss")),
    MICRO_SCHEMA: (MICRO_FIELDS, MICRO_STATUSES, ("computations_per_sec",)),
}


def fields_of(schema: str) -> dict:
  """field -> accepted types of a schema's records, in the order they are written."""
  return _KINDS[schema][0]


def validate(record: dict, written_now: bool = True) -> None:
  """Raises ValueError listing every way `record` departs from its schema. A record
  read back (written_now=False) may lack the schema's LATER_FIELDS."""
  if record.get("schema") not in _KINDS:
    raise ValueError(f"schema is {record.get('schema')!r}, expected one of {sorted(_KINDS)}")
  fields, statuses, needed_when_ok = _KINDS[record["schema"]]
  optional = () if written_now else LATER_FIELDS[record["schema"]]
  problems = [f"missing {k}" for k in fields if k not in record and k not in optional]
  problems += [f"unknown field {k}" for k in record if k not in fields]
  for key, types in fields.items():
    allows_bool = bool in (types if isinstance(types, tuple) else (types,))
    if key in record and (not isinstance(record[key], types)
                          or (isinstance(record[key], bool) and not allows_bool)):
      problems.append(f"{key} = {record[key]!r} has type {type(record[key]).__name__}")
  if record.get("status") not in statuses:
    problems.append(f"status {record.get('status')!r} not in {statuses}")
  elif record["status"] != "ok" and not record.get("error"):
    problems.append(f"a {record['status']} record needs an error saying why")
  if isinstance(record.get("step_time_s"), dict):
    if set(record["step_time_s"]) != set(STEP_TIME_KEYS):
      problems.append(f"step_time_s keys {sorted(record['step_time_s'])}")
  if isinstance(record.get("env"), dict):
    problems += [f"env lacks {k}" for k in ENV_KEYS if k not in record["env"]]
  if record.get("compilation_cache") not in COMPILATION_CACHE + (None,):
    problems.append(f"compilation_cache {record['compilation_cache']!r} not in "
                    f"{COMPILATION_CACHE} or null")
  if record.get("status") == "ok":
    problems += [f"an ok record needs {k}" for k in needed_when_ok
                 if record.get(k) is None]
  if problems:
    raise ValueError("; ".join(problems))


def check_appendable(path: str) -> list:
  """Fails fast (UsageError) if records cannot be appended to `path`.

  Creates the parent directory, never the file: another run may create it and append
  to it at any moment, so this check opens an existing file for appending (which
  writes nothing) and proves a new one could be made with a scratch file of its own
  beside it. Returns [(line number, problem)] for lines already in the file that are
  not records: they are left untouched, and reported.
  """
  p = pathlib.Path(path)
  if p.is_dir() or path.endswith(("/", os.sep)):
    raise UsageError(f"--results={path} is a directory; name a file such as "
                     f"{p / 'runs.jsonl'}")
  try:
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
      fd = os.open(p, os.O_RDWR)  # as append() opens it; no O_CREAT: never makes the file
      os.close(fd)
    except FileNotFoundError:
      with tempfile.NamedTemporaryFile(dir=p.parent, prefix=f".{p.name}.check-"):
        pass
  except OSError as e:
    raise UsageError(f"--results={path} is not writable ({e.strerror}); choose a "
                     "writable path, e.g. --results=results/runs.jsonl") from None
  return read(path)[1]


def append(path: str, record: dict) -> int:
  """Appends one record as one line; returns its 1-based line number. A write that
  cannot complete (no space, a quota, a file size limit, an I/O error, a signal)
  leaves the file as it was, then raises: never a torn last line."""
  validate(record)
  line = _line(record)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.lockf(fd, fcntl.LOCK_EX)  # taking it revalidates an NFS client's cache
    size = os.fstat(fd).st_size
    existing = os.pread(fd, size, 0)
    if existing and not existing.endswith(b"\n"):
      line = b"\n" + line  # close a line a crash left open; it stays malformed
    _write_whole(fd, line, size_before=size)
  finally:
    os.close(fd)  # releases the lock
  return existing.count(b"\n") + line.count(b"\n")


def _line(record: dict) -> bytes:
  # Strict JSON: a diverged run's NaN / inf losses are written as null.
  return (json.dumps(_finite(record), allow_nan=False) + "\n").encode("utf-8")


def _write_whole(fd: int, data: bytes, size_before: int) -> None:
  """Writes all of `data` and syncs it, or truncates the file back to size_before and
  re-raises. os.write may write part of its buffer and return the count (a file
  size limit, a full disk): the rest is retried, which then fails with the cause."""
  try:
    written = 0
    while written < len(data):
      written += os.pwrite(fd, data[written:], size_before + written)
    os.fsync(fd)
  except BaseException:
    os.ftruncate(fd, size_before)
    raise


def keep_aside(record: dict) -> str:
  """Where a record that append could not write went, for the error line that says
  so: a file of its own in the temporary directory (often another disk than a full
  one), else stderr."""
  line = _line(record)
  side = None
  try:
    fd, side = tempfile.mkstemp(prefix=f"tf_tput-record-{record.get('run_id')}-",
                                suffix=".jsonl")
    try:
      _write_whole(fd, line, size_before=0)
    finally:
      os.close(fd)
    return side
  except OSError:
    if side:
      os.unlink(side)
    print(line.decode("utf-8"), end="", file=sys.stderr, flush=True)
    return "stderr (the line above)"


def _finite(value):
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_finite(v) for v in value]
  return value


def read(path: str, schema: Optional[str] = None) -> tuple:
  """(records, problems): every valid record (of `schema`, if given), and
  [(line number, why)] for every line that is not one."""
  records, problems = [], []
  if not os.path.exists(path):
    return records, problems
  with open(path, "rb") as f:
    for number, raw in enumerate(f, start=1):
      if not raw.strip():
        continue
      try:
        record = json.loads(raw)
      except ValueError as e:
        problems.append((number, f"not JSON ({e.msg})"))
        continue
      if not isinstance(record, dict) or "schema" not in record:
        problems.append((number, "not a tf_tput record (no schema field)"))
        continue
      try:
        validate(record, written_now=False)
      except ValueError as e:
        problems.append((number, f"not a valid {record['schema']} record ({e})"[:300]))
        continue
      if schema is None or record["schema"] == schema:
        records.append(record)
  return records, problems
