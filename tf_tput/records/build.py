"""The fields every record starts and ends with, built once for train and micro records:
schema, run_id, started_at, status, error first; env and git_commit last."""

import datetime
import uuid

from tf_tput.records import provenance, results


def new_run_id() -> str:
  return uuid.uuid4().hex[:12]


def utc_now() -> str:
  """ISO-8601 UTC, to the second: a record's started_at."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(schema: str, fields: dict, accelerators: list, distributions: dict, *,
           status: str, error=None, run_id=None, started_at=None) -> dict:
  """A `schema` record in its schema's field order; env carries the versions of
  `distributions` (tf_tput.systems.distributions()). Fields the schema does not know
  are kept (after the known ones), so results.validate names them."""
  whole = {"schema": schema, "run_id": run_id or new_run_id(),
           "started_at": started_at or utc_now(), "status": status, "error": error,
           **fields, "env": provenance.env(accelerators, distributions),
           "git_commit": provenance.git_commit()}
  ordered = {key: whole.pop(key) for key in results.fields_of(schema) if key in whole}
  ordered.update(whole)
  return ordered
