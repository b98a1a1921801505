"""Experiment configuration: gin-configurable frozen dataclasses, validated early.

Gin files under gin/ bind these classes and nothing else, so every system
reads the same model truth. Validation needs no ML framework: a wrong binding, a mesh
that does not match the devices or a dimension its mesh axis does not divide fails in
milliseconds, before TensorFlow or JAX start.
"""

import contextlib
import dataclasses
import functools
import importlib.util  # noqa: F401  gin 0.5 needs it loaded to report a missing include
import logging
import pathlib
import re
import tokenize
import typing
from typing import Optional, Sequence

import gin

from tf_tput import GIN_DIR, GIN_PARENT
from tf_tput import errors, models, pipeline
from tf_tput.errors import UsageError

ARCHS = ("encoder_decoder", "decoder")
DTYPES = ("float32", "bfloat16")
DATA_SOURCES = ("synthetic", "tfds")
# How token ids become embeddings. one_hot: one_hot(ids) @ embedding, a matmul over the
# vocabulary, as mtf.gather computes it (and its gradient is a dense matmul too);
# gather: a row lookup with a scatter-add gradient, for systems that have one.
EMBEDDINGS = ("one_hot", "gather")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A T5-family Transformer (mesh_tensorflow.transformer semantics)."""
  name: str
  arch: str                 # "encoder_decoder" (T5) or "decoder" (decoder-only LM)
  num_layers: int           # per stack: T5's encoder and decoder each have this many
  d_model: int
  d_ff: int
  num_heads: int
  d_kv: int                 # per head; attention width is num_heads * d_kv
  vocab_size: int           # padded to a multiple of 128 as mtf does (models.py)
  relative_attention_num_buckets: int = 32
  activation_dtype: str = "float32"   # variables stay float32 in every case
  embedding: str = "one_hot"          # EMBEDDINGS; also the relative-bias lookup
  # Each stack's layers stacked and run as one loop (where a system has it; the others
  # refuse it): the same arithmetic, one layer to compile instead of num_layers.
  scan_layers: bool = False


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh TensorFlow syntax: mesh "batch:2;model:2", layout "tensor_dim:mesh_axis;..."."""
  mesh_shape: str = "batch:1"
  layout: str = "batch:batch;d_ff:model;heads:model;vocab:model"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """A pipeline of `stages` x `micro_batches` (tf_tput/pipeline.py); 1 stage: none.

  With stages > 1 the devices split into `stages` consecutive groups and MeshConfig
  describes one group: mesh_shape's size is the devices per stage.
  """
  stages: int = 1
  micro_batches: int = 1    # the global batch splits into this many, one after another
  schedule: str = "gpipe"   # pipeline.SCHEDULES


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainConfig:
  global_batch: int = 8
  steps: int = 20           # measured steps
  warmup_steps: int = 2     # run first, not measured (graph build / compile)
  seed: int = 0
  sync_every: int = 1       # steps per timed window: the loss is fetched once per window


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DataConfig:
  source: str = "synthetic"       # "synthetic" (seeded, no padding) or "tfds"
  inputs_length: int = 128        # encoder tokens per example (encoder_decoder only)
  targets_length: int = 128
  tfds_name: str = ""             # e.g. "lm1b"; with source = "tfds"
  tfds_split: str = "train"
  data_dir: Optional[str] = None
  text_key: str = "text"
  pack: bool = False              # pack several examples per row (tfds only)


@dataclasses.dataclass(frozen=True)
class Experiment:
  model: ModelConfig
  mesh: MeshConfig
  train: TrainConfig
  data: DataConfig
  operative_config: str     # the gin text that produced this experiment
  pipeline: PipelineConfig = PipelineConfig()

  @property
  def mesh_shape(self) -> dict:
    return parse_mesh_shape(self.mesh.mesh_shape)

  @property
  def layout(self) -> dict:
    return parse_layout(self.mesh.layout)

  @property
  def num_devices(self) -> int:
    """Every device of the run: the mesh's, times the pipeline's stages."""
    return mesh_size(self.mesh_shape) * self.pipeline.stages

  @property
  def pipelined(self) -> bool:
    return self.pipeline.stages > 1


def _pairs(text: str, what: str, example: str) -> list:
  pairs = []
  for item in filter(None, (part.strip() for part in text.split(";"))):
    key, sep, value = (s.strip() for s in item.partition(":"))
    if not sep or not key or not value:
      raise UsageError(f"{what} {text!r}: entry {item!r} is not 'name:value'; "
                       f"write it as {example!r}")
    pairs.append((key, value))
  return pairs


def parse_mesh_shape(text: str) -> dict:
  """"batch:2;model:2" -> {"batch": 2, "model": 2} (order kept)."""
  shape = {}
  for axis, size in _pairs(text, "mesh_shape", "batch:2;model:2"):
    if not size.isdigit() or int(size) < 1:
      raise UsageError(f"mesh_shape {text!r}: axis {axis!r} has size {size!r}; "
                       "sizes are positive integers, e.g. 'batch:2;model:2'")
    if axis in shape:
      raise UsageError(f"mesh_shape {text!r} names axis {axis!r} twice")
    shape[axis] = int(size)
  if not shape:
    raise UsageError("mesh_shape is empty; use 'batch:1' for one device")
  return shape


def parse_layout(text: str) -> dict:
  """"batch:batch;d_ff:model" -> {"batch": "batch", "d_ff": "model"}."""
  layout = {}
  for tensor_dim, axis in _pairs(text, "layout", "batch:batch;d_ff:model"):
    if tensor_dim in layout:
      raise UsageError(f"layout {text!r} maps {tensor_dim!r} twice; keep one rule")
    layout[tensor_dim] = axis
  return layout


def mesh_size(mesh_shape: dict) -> int:
  size = 1
  for axis_size in mesh_shape.values():
    size *= axis_size
  return size


# GIN_DIR's folders, where a bare file name (t5_small, data2_model2) is looked up.
GIN_FOLDERS = ("models", "mesh", "pipeline", "suites")


def resolve_gin_file(name: str) -> pathlib.Path:
  """The gin file `name` names, the first of: the path as given (relative to the
  current directory, or absolute); relative to GIN_PARENT (gin/models/t5_small.gin,
  from any directory); under GIN_DIR (models/t5_small.gin);
  a bare file name, .gin optional (t5_small, s4_m16.gin), in one of GIN_FOLDERS.
  UsageError (one line) when nothing matches or a bare name is in several folders."""
  for candidate in (pathlib.Path(name), GIN_PARENT / name, GIN_DIR / name):
    if candidate.is_file():
      return candidate.resolve()
  stem = name[:-len(".gin")] if name.endswith(".gin") else name
  if stem and pathlib.Path(name).name == name:  # a bare file name, no folder
    matches = [f"{folder}/{stem}.gin" for folder in GIN_FOLDERS
               if (GIN_DIR / folder / f"{stem}.gin").is_file()]
    if len(matches) == 1:
      return (GIN_DIR / matches[0]).resolve()
    if matches:
      raise UsageError(f"gin file {name!r} is in more than one folder of {GIN_DIR}: "
                       f"{', '.join(matches)}; pass one of those paths")
  raise UsageError(f"gin file {name!r} not found (as a path, under {GIN_DIR}, or as a "
                   f"file name in its {', '.join(GIN_FOLDERS)} folders); pass a file "
                   "name such as t5_small, or a path")


def _parse(what: str, parse) -> None:
  try:
    parse()
  except (ValueError, SyntaxError, IOError, AttributeError, tokenize.TokenError) as e:
    raise UsageError(f"gin: {what}: {errors.one_line(e)}; check it against the configurables "
                     "in tf_tput/config.py") from None


@contextlib.contextmanager
def quiet_include_probes():
  """gin probes each include (gin/models/t5_common.gin) as a Python-path resource
  (package `gin.models`: gin-config's own `gin`, which has none) before its search
  path and logs the miss at ERROR on the root logger: a stray line from any
  directory, although the include is then found under GIN_PARENT. Silences them;
  load_experiment parses inside it."""
  root = logging.getLogger()
  level = root.level
  root.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    root.setLevel(level)


def add_gin_search_path() -> None:
  """Makes gin `include 'gin/models/t5_common.gin'` lines resolve from any directory:
  against GIN_PARENT, once (gin.clear_config keeps search paths)."""
  if str(GIN_PARENT) not in gin.config._LOCATION_PREFIXES:
    gin.add_config_file_search_path(str(GIN_PARENT))


# A gin `include 'file'` statement (gin's grammar: a statement of its own line).
_INCLUDE = re.compile(r"""^\s*include\s+(['"])(.+?)\1""", re.MULTILINE)


def _shown(path: pathlib.Path) -> str:
  """A gin file as a user names it: gin/models/t5_tiny.gin, else its path."""
  try:
    return str(path.relative_to(GIN_PARENT))
  except ValueError:
    return str(path)


def _find_include(name: str) -> Optional[pathlib.Path]:
  """Where gin's parse_config_file finds an included file: the name itself (relative
  to the current directory, or absolute), then under each search path."""
  prefixes = [""] if pathlib.Path(name).is_absolute() else gin.config._LOCATION_PREFIXES
  for prefix in prefixes:
    candidate = pathlib.Path(prefix, name)
    if candidate.is_file():
      return candidate.resolve()
  return None


def check_includes(path: pathlib.Path, chain: tuple = ()) -> None:
  """Follows `path`'s include lines (and theirs) before gin parses them: an include
  cycle would end in a RecursionError, a missing file in gin's error naming only the
  top file. UsageError (one line) naming the cycle's files, or the including file and
  the missing name. Call it after add_gin_search_path, where gin looks."""
  chain += (path,)
  try:
    text = path.read_text()
  except (OSError, UnicodeDecodeError) as e:
    raise UsageError(f"gin file {_shown(path)} cannot be read ({errors.one_line(e)}); "
                     "pass a readable gin file") from None
  for match in _INCLUDE.finditer(text):
    name = match.group(2)
    included = _find_include(name)
    if included is None:
      raise UsageError(f"gin: {_shown(path)} includes {name!r}, which is not found (as a "
                       f"path or under {GIN_PARENT}); fix or remove that include line")
    if included in chain:
      cycle = chain[chain.index(included):] + (included,)
      raise UsageError("gin: include cycle: " + " includes ".join(map(_shown, cycle))
                       + "; remove one of these include lines")
    check_includes(included, chain)


def load_experiment(gin_files: Sequence[str], gin_params: Sequence[str] = (),
                    options: Sequence = ()) -> Experiment:
  """Parses gin files, then bindings (later ones win), into a validated Experiment.

  options: the gin configurables of the systems that will run it (System.options,
  tf_tput.systems.options), called once here because gin's operative config, which
  records keep, holds only the configurables that were called. The config stays
  unlocked: mesh_tensorflow registers configurables on import.
  """
  if not gin_files:
    raise UsageError("no --gin_file given; pass a model, e.g. --gin_file=t5_small "
                     "(a file of gin/models/)")
  paths = [str(resolve_gin_file(name)) for name in gin_files]
  gin.clear_config()
  add_gin_search_path()
  for path in paths:
    check_includes(pathlib.Path(path))
  with quiet_include_probes():
    for path in paths:
      _parse(path, functools.partial(gin.parse_config_file, path))
  for binding in gin_params:
    _parse(f"binding {binding!r}", functools.partial(gin.parse_config, binding))
  try:
    experiment_parts = dict(model=ModelConfig(), mesh=MeshConfig(),
                            train=TrainConfig(), data=DataConfig(),
                            pipeline=PipelineConfig())
    for configurable in options:
      configurable()
  except TypeError as e:
    macro = re.search(r"configurable 'macro' .* in scope '([^']*)'", str(e))
    if macro:
      raise UsageError(f"gin: macro %{macro.group(1)} is used but never defined; define "
                       f"it ({macro.group(1)} = VALUE) or bind the value itself") from None
    missing = re.search(r"arguments: (\[.*?\])", str(e))
    raise UsageError(
        f"gin: no value bound for {missing.group(1) if missing else errors.one_line(e)}; "
        "pass a model file, e.g. --gin_file=t5_small (a file of gin/models/)") from None
  except ValueError as e:  # e.g. a reference gin cannot evaluate
    raise UsageError(f"gin: {errors.one_line(e)}; check the bindings against the "
                     "configurables in tf_tput/config.py") from None
  experiment = Experiment(**experiment_parts, operative_config=gin.operative_config_str())
  validate(experiment)
  return experiment


def _check_positive(value, name: str, minimum: int = 1, maximum: int = None) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
    raise UsageError(f"{name} = {value!r}; it must be an integer >= {minimum}")
  if maximum is not None and value > maximum:
    raise UsageError(f"{name} = {value!r}; it must be an integer <= {maximum}")


# Every gin-configurable dataclass above: check_fields checks each of their fields.
CONFIGS = (ModelConfig, MeshConfig, PipelineConfig, TrainConfig, DataConfig)
# Integer fields: [1, INT_MAX] unless INT_RANGES says otherwise. INT_MAX is int32's:
# token ids are int32 (data.py), and a count or size past it is a typo, not a run.
INT_MAX = 2 ** 31 - 1
INT_RANGES = {
    "ModelConfig.vocab_size": (3, INT_MAX),   # pad, EOS and at least one token
    "TrainConfig.seed": (0, INT_MAX),         # numpy, TF and JAX all take it
    "DataConfig.inputs_length": (0, INT_MAX),  # >= 1 for encoder-decoder models (validate)
}
# Text fields with a fixed set of values.
CHOICES = {
    "ModelConfig.arch": ARCHS, "ModelConfig.activation_dtype": DTYPES,
    "ModelConfig.embedding": EMBEDDINGS, "DataConfig.source": DATA_SOURCES,
    "PipelineConfig.schedule": pipeline.SCHEDULES,
}
# Text fields that may be empty: '' is "none" (a layout without rules; no tfds name).
MAY_BE_EMPTY = ("MeshConfig.layout", "DataConfig.tfds_name")
# tf_tput.train flags that set a binding, named beside it; a run applies them after
# --gin_param, in this order (tf_tput/request.py), which the run key keeps.
FLAG_OF = {"TrainConfig.steps": "--steps", "TrainConfig.warmup_steps": "--warmup_steps",
           "TrainConfig.global_batch": "--global_batch"}


def field_label(binding: str) -> str:
  """'TrainConfig.steps (--steps)': a binding and the flag that sets it, if any."""
  return f"{binding} ({FLAG_OF[binding]})" if binding in FLAG_OF else binding


def check_fields(experiment: Experiment) -> None:
  """Every field of every config by its annotated type (int, str, bool, Optional[...])
  and its range (INT_RANGES, CHOICES, MAY_BE_EMPTY): UsageError naming the binding
  and what it must be. A field added to a config is checked by its type at once."""
  for part in (getattr(experiment, f.name) for f in dataclasses.fields(experiment)):
    if not isinstance(part, CONFIGS):
      continue  # operative_config: gin's own text
    hints = typing.get_type_hints(type(part))
    for field in dataclasses.fields(part):
      binding = f"{type(part).__name__}.{field.name}"
      _check_field(binding, getattr(part, field.name), hints[field.name])


def _check_field(binding: str, value, annotation) -> None:
  label = field_label(binding)
  kinds = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Union \
      else (annotation,)
  if value is None and type(None) in kinds:
    return
  kind = next(k for k in kinds if k is not type(None))
  optional = " or None" if type(None) in kinds else ""
  if kind is int:
    low, high = INT_RANGES.get(binding, (1, INT_MAX))
    _check_positive(value, label, minimum=low, maximum=high)
  elif kind is bool:
    if not isinstance(value, bool):
      raise UsageError(f"{label} = {value!r}; it must be True or False{optional}")
  elif kind is str:
    if binding in CHOICES:
      if not isinstance(value, str) or value not in CHOICES[binding]:
        raise UsageError(f"{label} = {value!r}; choose one of {CHOICES[binding]}")
    elif not isinstance(value, str) or not (value or binding in MAY_BE_EMPTY):
      empty = "a string" if binding in MAY_BE_EMPTY else "a non-empty string"
      raise UsageError(f"{label} = {value!r}; it must be {empty}{optional}, quoted: "
                       f"--gin_param=\"{binding} = 'TEXT'\"")
  else:  # a new kind of field: give it a rule here
    raise TypeError(f"{binding}: config.check_fields has no rule for {annotation}")


def tensor_dim_sizes(experiment: Experiment) -> dict:
  """Sizes of the named tensor dimensions a layout can place on mesh axes."""
  m = experiment.model
  return {  # a pipeline's stage holds one micro-batch at a time
      "batch": experiment.train.global_batch // experiment.pipeline.micro_batches, "d_model": m.d_model, "d_ff": m.d_ff,
      "heads": m.num_heads, "d_kv": m.d_kv, "vocab": models.padded_vocab(m.vocab_size),
  }


def validate(experiment: Experiment, num_devices: Optional[int] = None,
             num_processes: int = 1) -> None:
  """Raises UsageError naming the first bad value and its fix.

  num_devices counts every process's devices (num_processes of them).
  """
  m, t, d = experiment.model, experiment.train, experiment.data
  check_fields(experiment)  # every field's type and range; then how they combine
  for field in ("mesh_shape", "layout"):
    try:
      (parse_mesh_shape if field == "mesh_shape" else parse_layout)(
          getattr(experiment.mesh, field))
    except UsageError as e:
      raise UsageError(f"MeshConfig.{field}: {e}") from None
  for name, value in (("warmup_steps", t.warmup_steps), ("steps", t.steps)):
    if value % t.sync_every:  # windows are whole: the clock reads only after a fetch
      raise UsageError(f"TrainConfig.{name} = {value} is not a multiple of "
                       f"TrainConfig.sync_every = {t.sync_every}; pass --{name}="
                       f"{-(-value // t.sync_every) * t.sync_every}")
  if m.arch == "encoder_decoder":
    _check_positive(d.inputs_length, "DataConfig.inputs_length")
  if d.source == "tfds" and not d.tfds_name:
    raise UsageError("DataConfig.source = 'tfds' needs DataConfig.tfds_name, "
                     "e.g. --gin_param=\"DataConfig.tfds_name='lm1b'\"")
  if d.pack and d.source != "tfds":
    raise UsageError("DataConfig.pack = True applies to tfds data only; synthetic "
                     "batches have no padding to pack away")

  pipeline.validate(experiment, num_devices)
  mesh_shape, layout = experiment.mesh_shape, experiment.layout
  size = experiment.num_devices
  if num_devices is not None and size != num_devices:
    per_stage = (f" ({experiment.pipeline.stages} stages of {mesh_size(mesh_shape)})"
                 if experiment.pipelined else "")
    raise UsageError(
        f"mesh_shape {experiment.mesh.mesh_shape!r}{per_stage} has {size} devices but "
        f"{num_devices} are available; pass " + (
            f"--num_cpu_devices={size // num_processes} or " if size % num_processes == 0
            else "") + f"a mesh file with {num_devices} devices (gin/mesh/)")
  dim_sizes = tensor_dim_sizes(experiment)
  _check_one_dim_per_axis(experiment, mesh_shape, layout)
  for tensor_dim, axis in layout.items():
    if tensor_dim not in dim_sizes:
      raise UsageError(f"layout {experiment.mesh.layout!r} names tensor dimension "
                       f"{tensor_dim!r}; known dimensions: {sorted(dim_sizes)}")
    if axis not in mesh_shape:
      continue  # as in mtf: a rule for an axis the mesh lacks does not apply
    if dim_sizes[tensor_dim] % mesh_shape[axis]:
      raise UsageError(
          f"{tensor_dim} = {dim_sizes[tensor_dim]} is not divisible by mesh axis "
          f"{axis!r} of size {mesh_shape[axis]} (layout {tensor_dim}:{axis}); change "
          f"the size, the mesh_shape or drop {tensor_dim}:{axis} from the layout")


def _check_one_dim_per_axis(experiment: Experiment, mesh_shape: dict, layout: dict) -> None:
  """As mtf requires: no tensor may put two of its dimensions on one mesh axis."""
  for dims in models.tensor_dim_names(experiment.model):
    on_axis = {}
    for name in dims:
      axis = layout.get(name)
      if axis in mesh_shape:
        if axis in on_axis:
          raise UsageError(
              f"layout {experiment.mesh.layout!r} puts {on_axis[axis]} and {name} on "
              f"mesh axis {axis!r}, but a tensor has both {dims}; map one of them to "
              "another axis or drop it from the layout")
        on_axis[axis] = name


def unpipelined(experiment: Experiment) -> Experiment:
  """The same model, batch and devices without a pipeline: what a pipeline's numerics
  are checked against (tf_tput.parity). The stages' devices join the batch axis:
  'batch:2' per stage x 2 stages becomes 'batch:4'. (Here, not in pipeline.py, which
  config imports: it builds configs.)"""
  if not experiment.pipelined:
    return experiment
  S = experiment.pipeline.stages
  axis = experiment.layout.get("batch", "batch")
  shape = dict(experiment.mesh_shape)
  shape[axis] = shape.get(axis, 1) * S
  if experiment.train.global_batch % shape[axis]:
    raise UsageError(f"the unpipelined twin of {S} stages x mesh "
                     f"{experiment.mesh.mesh_shape!r} has batch axis {axis!r} of size "
                     f"{shape[axis]}, which does not divide TrainConfig.global_batch = "
                     f"{experiment.train.global_batch}; choose a multiple of it")
  mesh = dataclasses.replace(experiment.mesh, mesh_shape=";".join(
      f"{name}:{size}" for name, size in shape.items()))
  # Every field given: gin would fill an omitted one from the pipelined bindings.
  none = PipelineConfig(stages=1, micro_batches=1, schedule=pipeline.SCHEDULES[0])
  twin = dataclasses.replace(experiment, mesh=mesh, pipeline=none)
  validate(twin)
  return twin
