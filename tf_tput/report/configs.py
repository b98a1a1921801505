"""What makes records one configuration, how a table names it, and which system the
ratios divide by. Every table, plot and --compare groups records by these keys."""

from tf_tput import systems

BASELINE_SYSTEM = systems.DEFAULT  # the paper's TF baseline: ratios divide by it
# Records that differ only in their system are the same configuration. The embedding
# is part of it: a row lookup does less arithmetic than mtf's one-hot matmul. Records
# from before a field existed (results.LATER_FIELDS) have None there. sync_every too:
# fetching the loss every k steps lets an asynchronous system overlap steps.
CONFIG_KEYS = ("model", "dtype", "embedding", "mesh_shape", "layout", "num_devices",
               "global_batch", "inputs_length", "targets_length", "sync_every",
               "pipeline_stages", "micro_batches")
# What a record from before a field means by its absence, where that is known: the
# loop fetched every step's loss before sync_every existed, and no system pipelined. (An old jax record's
# embedding is not known to be one_hot: it stays None, its own configuration.)
ABSENT_MEANS = {"sync_every": 1, "pipeline_stages": 1, "micro_batches": 1}
# The record fields train_key's values come from, in its order.
TRAIN_KEY_FIELDS = CONFIG_KEYS + ("num_processes", "strategy", "launcher", "system")


def variant_as_system(r: dict) -> dict:
  """A record run in a variant of its system (its `variant`: non-default options,
  scanned layers) as a system of its own, "torch [TorchOptions.compile=True]": every
  table, plot and --compare then gives it its own row and band, and its ratio to the
  baseline on the same configuration (a variant keeps the arithmetic)."""
  if not r.get("variant"):
    return r
  return {**r, "system": f"{r['system']} [{r['variant']}]"}


def config_key(r: dict) -> tuple:
  return tuple(r.get(k, ABSENT_MEANS.get(k)) for k in CONFIG_KEYS)


def row_key(r: dict) -> tuple:
  """One row of the Table-1 table: the configuration, run the same way (processes,
  strategy and launcher: a multi-process run of a system is not its local run, nor
  one under srun one under torchrun)."""
  return config_key(r) + (r["num_processes"], r["strategy"], r.get("launcher"))


def train_key(r: dict) -> tuple:
  """What makes two train records the same configuration on the same system."""
  return row_key(r) + (r["system"],)


def micro_key(r: dict) -> tuple:
  return (r["system"], r["mode"], r["hosts"], r["devices_per_host"], r["chain_length"],
          r["computations"], r["matmul_n"])


def dtype_label(r: dict) -> str:
  """The dtype, the embedding where it is not mtf's one-hot matmul, sync_every where
  the loss is not fetched every step, and a pipeline's stages x micro-batches."""
  embedding, sync = r.get("embedding"), r.get("sync_every")
  stages = r.get("pipeline_stages") or 1
  return (r["dtype"] + (f" {embedding}" if embedding not in (None, "one_hot") else "")
          + (f" sync {sync}" if sync not in (None, 1) else "")
          + (f" pipeline {stages}x{r.get('micro_batches')}" if stages > 1 else ""))


def launched_as(r: dict, field: str) -> str:
  """A record's `field` (its process count, its strategy) with the launcher that
  started it, where one did: "2 (slurm)"."""
  launcher = r.get("launcher")
  return f"{r[field]}" + (f" ({launcher})" if launcher else "")


def systems_in(records: list) -> list:
  """System names, the baseline first."""
  names = sorted({r["system"] for r in records})
  return sorted(names, key=lambda s: s != BASELINE_SYSTEM)


def baseline_system(records: list) -> str:
  """The system ratios divide by: BASELINE_SYSTEM where the records have it, else the
  first name."""
  names = systems_in(records)
  return names[0] if names else BASELINE_SYSTEM
