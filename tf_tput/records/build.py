"""The fields every record starts and ends with, built once for train and micro records:
schema, run_id, started_at, status, error first; env and git_commit last."""

import datetime
import json
import logging
import numbers
import uuid
from typing import Optional

from tf_tput.records import provenance, results


RUN_ID_LENGTH = 12  # hex characters


def new_run_id() -> str:
  return uuid.uuid4().hex[:RUN_ID_LENGTH]


def utc_now() -> str:
  """ISO-8601 UTC, to the second: a record's started_at."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def record(schema: str, fields: dict, accelerators: list, distributions: dict, *,
           status: str, error=None, run_id=None, started_at=None,
           env_fields: Optional[dict] = None) -> dict:
  """A `schema` record in its schema's field order; env carries the versions of
  `distributions` (tf_tput.systems.distributions()), then env_fields (what the run
  chose of its environment: train's gemm). Fields the schema does not know are kept
  (after the known ones), so results.validate names them."""
  whole = {"schema": schema, "run_id": run_id or new_run_id(),
           "started_at": started_at or utc_now(), "status": status, "error": error,
           **fields, "env": {**provenance.env(accelerators, distributions),
                             **(env_fields or {})},
           "git_commit": provenance.git_commit()}
  ordered = {key: whole.pop(key) for key in results.fields_of(schema) if key in whole}
  ordered.update(whole)
  return ordered


def node_fields(nodes) -> dict:
  """A record's nodes (the distinct names, sorted) and num_nodes."""
  nodes = sorted(set(nodes))
  return {"nodes": nodes, "num_nodes": len(nodes)}


def plain(value):
  """The record's values as JSON has them: numpy scalars as Python numbers, tuples as
  lists, anything JSON cannot hold as its repr (which the schema then names)."""
  def scalars(v):
    if isinstance(v, dict):
      return {k: scalars(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
      return [scalars(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
      return v
    if isinstance(v, numbers.Integral):
      return int(v)
    if isinstance(v, numbers.Real):
      return float(v)
    return bool(v) if type(v).__name__ == "bool_" else v
  return json.loads(json.dumps(scalars(value), default=repr))


def conforming(record: dict, problem: str) -> dict:
  """A failed record the schema takes, made from one it refused: each value of the
  wrong type becomes None where its field allows None, else the nearest value of the
  field's type; the error says what was refused. Everything else is kept."""
  out = {}
  for key, types in results.fields_of(results.SCHEMA).items():
    types = types if isinstance(types, tuple) else (types,)
    value = record.get(key)
    if (key in record and isinstance(value, types)
        and (bool in types or not isinstance(value, bool))):
      out[key] = value
    elif type(None) in types:
      out[key] = None
    else:
      try:
        out[key] = types[0]() if value is None else types[0](value)
      except (TypeError, ValueError):
        out[key] = types[0]()  # 0, '', {} or []: the error holds the value refused
  out["step_time_s"] = {k: out["step_time_s"].get(k) for k in results.STEP_TIME_KEYS}
  out["env"] = {**{k: None for k in results.ENV_KEYS}, **out["env"]}
  error = f"record: the schema refused it ({problem})"[:1000]
  out.update(status="failed",
             error=f"{out['error']}; then {error}" if out["error"] else error)
  return out


def valid_record(record: dict) -> dict:
  """The record in JSON's types; where the schema refuses it, a failed record that it
  takes (conforming), the refused record in the log. ValueError when even that is
  refused."""
  record = plain(record)
  try:
    results.validate(record)
    return record
  except ValueError as e:
    logging.error("the record does not match its schema (%s): %s", e, json.dumps(record))
    fixed = conforming(record, str(e))
  results.validate(fixed)
  return fixed
