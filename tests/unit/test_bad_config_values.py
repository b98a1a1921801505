"""Every field of every config dataclass refuses values of the wrong type and out of
its range in one UsageError line that names the binding, before any framework starts.

The cases are made from the fields themselves (dataclasses.fields and their annotated
types), so a field added to a config is covered here at once; a field of a kind this
file cannot make cases for fails test_every_field_gets_cases.
"""

import dataclasses
import typing

import pytest

from tf_tput import config
from tf_tput.errors import UsageError

MODEL = ["t5_tiny"]  # encoder-decoder: every DataConfig length is in use
NOT_INT = ["'abc'", "2.0", "True", "[1]", "None", "{'a': 1}"]
NOT_STR = ["5", "2.5", "True", "['x']", "None"]
NOT_BOOL = ["'yes'", "1", "1.0", "[True]", "None"]
# Text whose content a field parses: values past its grammar.
UNPARSABLE = {"MeshConfig.mesh_shape": ["'batch:0'", "'batch'", "'batch:2;batch:2'"],
              "MeshConfig.layout": ["'d_ff'", "'d_ff:model;d_ff:batch'"]}


def _kinds(annotation) -> tuple:
  if typing.get_origin(annotation) is typing.Union:
    return typing.get_args(annotation)
  return (annotation,)


def bad_values(binding: str, annotation) -> list:
  """Gin texts of values `binding` must refuse: wrong types, then out of range."""
  kinds = _kinds(annotation)
  optional = type(None) in kinds
  kind = next(k for k in kinds if k is not type(None))
  drop_none = (lambda values: [v for v in values if v != "None"]) if optional else list
  if kind is int:
    low, high = config.INT_RANGES.get(binding, (1, config.INT_MAX))
    return drop_none(NOT_INT) + [str(low - 1), str(high + 1), "-1"]
  if kind is bool:
    return drop_none(NOT_BOOL)
  if kind is str:
    out_of_range = []
    if binding in config.CHOICES:
      out_of_range += ["'no_such_choice'", f"'{config.CHOICES[binding][0].upper()}'"]
    if binding not in config.MAY_BE_EMPTY and binding not in config.CHOICES:
      out_of_range.append("''")
    return drop_none(NOT_STR) + out_of_range + UNPARSABLE.get(binding, [])
  raise AssertionError(f"{binding}: no cases for a field of type {annotation}; "
                       "add them here and a rule to config.check_fields")


def _fields():
  for cls in config.CONFIGS:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
      yield f"{cls.__name__}.{field.name}", hints[field.name]


CASES = [(binding, value) for binding, annotation in _fields()
         for value in bad_values(binding, annotation)]


def test_every_field_gets_cases():
  covered = {binding for binding, _ in CASES}
  every = {f"{cls.__name__}.{f.name}" for cls in config.CONFIGS
           for f in dataclasses.fields(cls)}
  assert covered == every
  # Every gin-configurable dataclass of config.py is one of CONFIGS.
  configurable = {name for name, obj in vars(config).items()
                  if dataclasses.is_dataclass(obj) and isinstance(obj, type)
                  and obj.__module__ == config.__name__ and name != "Experiment"}
  assert configurable == {cls.__name__ for cls in config.CONFIGS}


@pytest.mark.parametrize("binding, value", CASES,
                         ids=[f"{binding}={value}" for binding, value in CASES])
def test_a_bad_value_is_one_line_naming_its_binding(binding, value):
  with pytest.raises(UsageError) as raised:
    config.load_experiment(MODEL, [f"{binding} = {value}"])
  message = str(raised.value)
  assert "\n" not in message and binding in message, message


def test_the_defaults_and_the_model_files_pass():
  config.load_experiment(MODEL)
  config.load_experiment(["decoder_tiny"], ["DataConfig.inputs_length = 0"])
  config.load_experiment(MODEL, ["DataConfig.data_dir = None", "MeshConfig.layout = ''",
                                 f"TrainConfig.seed = {config.INT_MAX}"])


@pytest.mark.parametrize("binding, needle", [
    ("TrainConfig.seed = 'abc'", "TrainConfig.seed = 'abc'; it must be an integer >= 0"),
    ("TrainConfig.steps = 2.5", "TrainConfig.steps (--steps) = 2.5; it must be an integer"),
    ("DataConfig.pack = 1", "DataConfig.pack = 1; it must be True or False"),
    ("ModelConfig.name = 5",
     "ModelConfig.name = 5; it must be a non-empty string, quoted: "
     "--gin_param=\"ModelConfig.name = 'TEXT'\""),
    ("ModelConfig.vocab_size = 3000000000", "it must be an integer <= 2147483647"),
    ("TrainConfig.seed = %UNDEFINED", "macro %UNDEFINED is used but never defined"),
])
def test_messages_say_what_the_value_must_be(binding, needle):
  with pytest.raises(UsageError) as raised:
    config.load_experiment(MODEL, [binding])
  assert needle in str(raised.value)
