"""What one training run is asked for: tf_tput.train's flags as one frozen object.

FLAGS_TABLE is the one table of them: each flag's name and help; the Request's field
of that name holds its type and default. tf_tput.train defines its flags from
it and turns the parsed flags into a Request (from_flags); everything below the entry
point reads the Request, never absl's flags. The record's `flags` field
(Request.as_flags) holds the same fields; the flags that override a binding are
config.FLAG_OF's (tests/unit/test_request.py holds the three equal).
"""

import dataclasses
import sys
from typing import Optional

from absl import flags

from tf_tput import config, systems
from tf_tput.measure import gemm
from tf_tput.runtime import topology, watchdog


@dataclasses.dataclass(frozen=True)
class Flag:
  """A flag of tf_tput.train: its help and, for an enum, its choices (its Request
  field holds its type and default)."""
  name: str
  help: str
  choices: tuple = ()  # the values it may take, where a fixed few (an absl enum)


def _table() -> tuple:
  return (
      Flag("gin_file", "Gin file (repeatable; later files win), "
           "e.g. gin/models/t5_small.gin and gin/mesh/data2_model2.gin."),
      Flag("gin_param", "Gin binding (repeatable), applied after "
           "the files, e.g. \"ModelConfig.activation_dtype='bfloat16'\"."),
      Flag("system", "System under test: "
           f"{', '.join(systems.REGISTRY)}."),
      Flag("strategy", "Where the devices are (each system lists the strategies it runs "
           "under, docs/systems.md). local: this process's (--num_cpu_devices, "
           "accelerators, or the processes of tf_tput.launch --num_processes). "
           "multi_worker: the worker servers of a cluster (tf_tput.launch "
           "--num_workers sets one up on loopback): this process drives them, "
           "or is one of them where every worker runs the program. tpu: a "
           "Cloud TPU named by --tpu; NOT exercised by CI or by the tests "
           "beyond the connection (no TPU there).", choices=topology.STRATEGIES),
      Flag("results", "JSON-lines file the record is "
           "appended to (created with its directory)."),
      Flag("num_cpu_devices", "Split the host CPU into this many "
           "virtual devices (they share its cores). Unset: GPUs if present, else 1 CPU."),
      Flag("steps", "Measured steps (overrides TrainConfig.steps)."),
      Flag("warmup_steps", "Unmeasured first steps, >= 1 "
           "(overrides TrainConfig.warmup_steps)."),
      Flag("global_batch", "Examples per step over all devices "
           "(overrides TrainConfig.global_batch)."),
      Flag("tensorboard_dir", "Write per-step scalars here."),
      Flag("trace_dir", "After the measured steps, run one more step "
           "under the framework's trace, write it to DIR/<run id>.trace.json and "
           "print where each device's time went (systems that trace: "
           f"{', '.join(systems.able('traces'))})."),
      Flag("log_every", "Log progress every this many measured steps."),
      Flag("cluster_timeout_s", "How long to wait for anything outside "
           "this process to answer before the run fails naming it: the workers "
           "of a cluster (multi_worker), the other processes under tf_tput.launch "
           "and their coordinator, a Cloud TPU (tpu)."),
      Flag("tpu", "tpu: the Cloud TPU's name, grpc://host:8470, or local "
           "(on a TPU VM)."),
      Flag("tpu_type", "TPU generation for the MFU peak (v2, v3, v4, "
           "v5e, v5p; an accelerator type such as v3-32 also works) where the run "
           "cannot tell it (--tpu=local or an address), or to override the "
           "device kind a framework reports. Only on TPUs."),
      Flag("tpu_zone", "tpu: its GCP zone (unset: from the metadata)."),
      Flag("gcp_project", "tpu: its GCP project (unset: from the "
           "metadata)."),
      Flag("compilation_cache_dir", "Keep compiled programs here, where "
           "the system's runtime has a persistent compilation cache (systems "
           f"that have one: {', '.join(systems.able('compilation_cache'))}), so a "
           "later run of the same program loads them instead of compiling. "
           "Unset: $XDG_CACHE_HOME/tf_tput/compilation (~/.cache/tf_tput/"
           "compilation without XDG_CACHE_HOME). Empty or 'none': off. Records "
           "say whether the run hit it (compilation_cache)."),
      Flag("reprobe_peak", "Measure this CPU's matmul peak (MFU's "
           "denominator) again, and keep the new one, instead of the probe kept "
           "in $XDG_CACHE_HOME/tf_tput/peaks.json (~/.cache/tf_tput/ without "
           "XDG_CACHE_HOME) for this CPU, framework version and dtype."),
      Flag("keep_freed_memory", "Keep freed host memory for reuse "
           "(glibc's malloc: no mmap, no trim) so a step's temporaries do not fault in "
           "fresh pages every step; --nokeep_freed_memory leaves the libc's "
           "default. Records say which (env.host_allocator)."),
      Flag("step_timeout_s", "End the run as failed, naming the step, "
           "when a window of the measured loop (sync_every steps) after the "
           "first has not completed after this many seconds: a hung collective "
           f"or a stopped peer. The first window, which compiles, gets "
           f"{watchdog.FIRST_WINDOW_S:g} s (or this, if longer). Unset: "
           f"{watchdog.FACTOR:g} times the slowest window so far, at least "
           f"{watchdog.FLOOR_S:g} s."),
      Flag("gemm", "The GEMM path the framework's CPU matmuls "
           "take, where it has several (docs/systems.md, 'GEMM paths'): "
           f"'{gemm.AUTO}' is the fastest of their peak probes, each probed "
           "once per machine and kept beside the peak (a path the runtime "
           "names only is left out); a name forces that path. Records say "
           "which ran (env.gemm)."),
      Flag("packed", "This run is meant to share its host with other "
           "measured runs (a packed Slurm array, several suites at once): the "
           "record says so (packed) and reports mark its concurrent_runs as "
           "asked for. Without it, another run live on the host at the same "
           "time is marked as unasked sharing."),
  )


@dataclasses.dataclass(frozen=True)
class Request:
  """One run's request: tf_tput.train's flags, each field's type and default its
  flag's (FLAGS_TABLE holds their help), in the order records list them (`flags`)."""
  gin_file: tuple = ()
  gin_param: tuple = ()
  system: str = systems.DEFAULT
  strategy: str = "local"
  results: str = "results/runs.jsonl"
  num_cpu_devices: Optional[int] = None
  steps: Optional[int] = None
  warmup_steps: Optional[int] = None
  global_batch: Optional[int] = None
  tensorboard_dir: Optional[str] = None
  trace_dir: Optional[str] = None
  log_every: int = 10
  cluster_timeout_s: float = 60.0
  tpu: Optional[str] = None
  tpu_type: Optional[str] = None
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  compilation_cache_dir: Optional[str] = None
  reprobe_peak: bool = False
  keep_freed_memory: bool = True
  step_timeout_s: Optional[float] = None
  gemm: str = gemm.AUTO
  packed: bool = False

  def bindings(self) -> list:
    """--gin_param, then the flags that override bindings (config.FLAG_OF), applied as
    bindings so the recorded config is exact: every binding applied."""
    return list(self.gin_param) + [
        f"{binding} = {getattr(self, flag[2:])}" for binding, flag in config.FLAG_OF.items()
        if getattr(self, flag[2:]) is not None]

  def as_flags(self) -> dict:
    """The record's `flags`: each flag's value, a repeated flag's as a list."""
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(self).items()}


FLAGS_TABLE = _table()
FIELDS = {field.name: field for field in dataclasses.fields(Request)}
# absl's parser for each field type (an Optional[...] field's, its inner type's).
_PARSERS = {str: flags.ArgumentParser, int: flags.IntegerParser, float: flags.FloatParser}


def _type(field: dataclasses.Field) -> type:
  inner = [t for t in getattr(field.type, "__args__", ()) if t is not type(None)]
  return inner[0] if inner else field.type


def define_flags(module_name: str, flag_values=flags.FLAGS) -> None:
  """Defines FLAGS_TABLE's flags, in its order, in absl's flag_values (its global
  FLAGS unless another is given) as module_name's own, which its --helpshort lists."""
  # absl's own rule: a module run as __main__ owns its flags as sys.argv[0].
  owner = sys.argv[0] if module_name == "__main__" else module_name
  for f in FLAGS_TABLE:
    field = FIELDS[f.name]
    kind, where = _type(field), {"flag_values": flag_values, "module_name": owner}
    if f.choices:
      flags.DEFINE_enum(f.name, field.default, f.choices, f.help, **where)
    elif kind is bool:
      flags.DEFINE_bool(f.name, field.default, f.help, **where)
    elif kind is tuple:
      flags.DEFINE_flag(flags.MultiFlag(flags.ArgumentParser(), flags.ArgumentSerializer(),
                                        f.name, list(field.default), f.help), **where)
    else:
      flags.DEFINE(_PARSERS[kind](), f.name, field.default, f.help,
                   serializer=flags.ArgumentSerializer(), **where)


def from_flags(parsed=flags.FLAGS) -> Request:
  """The Request absl's parsed flag values hold."""
  return Request(**{name: (tuple(parsed[name].value) if _type(field) is tuple
                           else parsed[name].value) for name, field in FIELDS.items()})
