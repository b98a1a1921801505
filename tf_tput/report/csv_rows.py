"""results.csv: every record, train and micro, one row each."""

import json

from tf_tput import systems
from tf_tput.records import results

# Nested fields flattened (step_time_s -> step_time_<stat>_s, env -> env_<key>);
# lists and the flags as JSON text; the multi-line gin `config` is left to the JSONL.
CSV_SKIPPED = ("config",)


def env_columns() -> list:
  """env_<key> for what every record's env holds and every registered system's
  library versions (tf_tput.systems.distributions)."""
  python, *rest = results.ENV_KEYS
  return [f"env_{k}" for k in (python, *systems.distributions(), *rest, "cpu_count")]


def csv_columns() -> list:
  columns, fields = ["schema"], dict.fromkeys([*results.FIELDS, *results.MICRO_FIELDS])
  for name in fields:
    if name == "step_time_s":
      columns += [f"step_time_{k}_s" for k in results.STEP_TIME_KEYS]
    elif name == "env":
      columns += env_columns()
    elif name not in columns and name not in CSV_SKIPPED:
      columns.append(name)
  return columns


def csv_row(r: dict) -> dict:
  row, env_keys = {}, env_columns()
  for name, value in r.items():
    if name in CSV_SKIPPED:
      continue
    if name == "step_time_s":
      row.update({f"step_time_{k}_s": v for k, v in value.items()})
    elif name == "env":
      row.update({f"env_{k}": json.dumps(v) if isinstance(v, (list, dict)) else v
                  for k, v in value.items() if f"env_{k}" in env_keys})
    elif isinstance(value, (list, dict)):
      row[name] = json.dumps(value)
    else:
      row[name] = value
  return row
