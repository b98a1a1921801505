"""tf_tput/config.py: mesh/layout parsing, gin loading errors, validation.

gin is global state: load_experiment calls gin.clear_config() itself, so every test
that needs an Experiment loads its own.
"""

import dataclasses

import pytest

import tf_tput
from tf_tput import config
from tf_tput.errors import UsageError

TINY = ["gin/models/t5_tiny.gin"]


def _one_line_usage_error(fn, *args, **kwargs) -> str:
  with pytest.raises(UsageError) as info:
    fn(*args, **kwargs)
  message = str(info.value)
  assert "\n" not in message, message
  assert message.strip()
  return message


# --------------------------------------------------------------------------------------
# parse_mesh_shape / parse_layout

@pytest.mark.parametrize("text,expected", [
    ("batch:2;model:2", {"batch": 2, "model": 2}),
    ("batch:4", {"batch": 4}),
    (" model : 4 ; batch:1 ;", {"model": 4, "batch": 1}),
    ("batch:1", {"batch": 1}),
])
def test_parse_mesh_shape_good(text, expected):
  got = config.parse_mesh_shape(text)
  assert got == expected
  assert list(got) == list(expected)   # axis order is kept


@pytest.mark.parametrize("text,needle", [
    ("batch:two", "two"),
    ("batch:0", "'0'"),
    ("batch:-1", "-1"),
    ("batch", "batch"),
    ("batch:2;batch:2", "batch"),
    ("", "empty"),
    (":2", ":2"),
    ("batch:2.5", "2.5"),
])
def test_parse_mesh_shape_bad(text, needle):
  message = _one_line_usage_error(config.parse_mesh_shape, text)
  assert needle in message


def test_parse_layout_good():
  assert config.parse_layout("batch:batch;d_ff:model;heads:model") == {
      "batch": "batch", "d_ff": "model", "heads": "model"}
  assert config.parse_layout("") == {}


@pytest.mark.parametrize("text,needle", [
    ("batch:batch;d_ff", "d_ff"),
    ("d_ff:", "d_ff:"),
    ("batch=batch", "batch=batch"),
])
def test_parse_layout_bad(text, needle):
  message = _one_line_usage_error(config.parse_layout, text)
  assert needle in message


# --------------------------------------------------------------------------------------
# load_experiment

def test_load_experiment_good():
  e = config.load_experiment(TINY + ["gin/mesh/data2_model2.gin"],
                             ["TrainConfig.global_batch = 4", "TrainConfig.steps = 3"])
  assert e.model.name == "t5_tiny"
  assert e.model.d_model == 64
  assert e.train.global_batch == 4 and e.train.steps == 3
  assert e.mesh_shape == {"batch": 2, "model": 2}
  assert e.layout["d_ff"] == "model"
  assert e.num_devices == 4
  assert "ModelConfig.d_model = 64" in e.operative_config


def test_load_experiment_later_binding_wins():
  e = config.load_experiment(TINY, ["ModelConfig.d_model = 32", "ModelConfig.d_model = 96"])
  assert e.model.d_model == 96


def test_load_experiment_clears_previous_bindings():
  config.load_experiment(TINY, ["TrainConfig.steps = 7"])
  assert config.load_experiment(TINY).train.steps == config.TrainConfig.__dataclass_fields__[
      "steps"].default


def test_load_experiment_missing_file():
  message = _one_line_usage_error(config.load_experiment, ["gin/models/nope.gin"])
  assert "nope.gin" in message


def test_load_experiment_unknown_binding():
  message = _one_line_usage_error(config.load_experiment, TINY,
                                  ["ModelConfig.d_modle = 3"])
  assert "d_modle" in message


def test_load_experiment_unknown_configurable():
  message = _one_line_usage_error(config.load_experiment, TINY, ["NoSuchThing.x = 1"])
  assert "NoSuchThing" in message


def test_load_experiment_without_model_file():
  message = _one_line_usage_error(config.load_experiment, ["gin/mesh/data4.gin"])
  assert "d_model" in message and "gin/models/" in message
  _one_line_usage_error(config.load_experiment, [])


def test_load_experiment_validates():
  message = _one_line_usage_error(config.load_experiment, TINY, ["TrainConfig.steps = 0"])
  assert "steps" in message and "0" in message


# --------------------------------------------------------------------------------------
# validate

@pytest.fixture
def base():
  return config.load_experiment(TINY + ["gin/mesh/data2_model2.gin"],
                                ["TrainConfig.global_batch = 4"])


def _replace(experiment, **parts):
  """Replaces fields of the experiment's parts: model={...}, train={...}, ..."""
  new = {k: dataclasses.replace(getattr(experiment, k), **v) for k, v in parts.items()}
  return dataclasses.replace(experiment, **new)


def test_validate_base_passes(base):
  config.validate(base)
  config.validate(base, num_devices=4)


def test_validate_mesh_size_mismatch(base):
  message = _one_line_usage_error(config.validate, base, num_devices=8)
  assert "batch:2;model:2" in message
  assert "4" in message and "8" in message


def test_validate_batch_not_divisible(base):
  bad = _replace(base, train={"global_batch": 3})
  message = _one_line_usage_error(config.validate, bad)
  assert "batch = 3" in message and "'batch'" in message


@pytest.mark.parametrize("model_change,mesh,needle", [
    ({"num_heads": 3}, {"mesh_shape": "batch:2;model:2"}, "heads = 3"),
    ({"d_ff": 255}, {"mesh_shape": "batch:2;model:2"}, "d_ff = 255"),
    # The vocabulary is padded to a multiple of 128, so only an odd axis splits it badly.
    ({}, {"mesh_shape": "model:3", "layout": "vocab:model"}, "vocab = 512"),
])
def test_validate_model_dims_not_divisible(base, model_change, mesh, needle):
  bad = _replace(base, model=model_change, mesh=mesh)
  message = _one_line_usage_error(config.validate, bad)
  assert needle in message
  assert "'model'" in message


def test_validate_rule_for_absent_axis_is_ignored(base):
  ok = _replace(base, model={"num_heads": 3}, mesh={"mesh_shape": "batch:4"})
  config.validate(ok, num_devices=4)


def test_validate_unknown_tensor_dim(base):
  bad = _replace(base, mesh={"layout": "length:model"})
  assert "length" in _one_line_usage_error(config.validate, bad)


@pytest.mark.parametrize("field", ["steps", "warmup_steps", "global_batch"])
def test_validate_train_counts_positive(base, field):
  bad = _replace(base, train={field: 0})
  message = _one_line_usage_error(config.validate, bad)
  assert f"{field}" in message and "= 0" in message


def test_validate_bad_arch(base):
  bad = _replace(base, model={"arch": "gpt"})
  assert "'gpt'" in _one_line_usage_error(config.validate, bad)


def test_validate_bad_dtype(base):
  bad = _replace(base, model={"activation_dtype": "float16"})
  assert "'float16'" in _one_line_usage_error(config.validate, bad)


@pytest.mark.parametrize("value", [0, -4, True, 64.0])
def test_validate_model_dims_must_be_positive_ints(base, value):
  bad = _replace(base, model={"d_model": value})
  message = _one_line_usage_error(config.validate, bad)
  assert "d_model" in message and repr(value) in message


def test_validate_data(base):
  assert "'hf'" in _one_line_usage_error(
      config.validate, _replace(base, data={"source": "hf"}))
  assert "tfds_name" in _one_line_usage_error(
      config.validate, _replace(base, data={"source": "tfds"}))
  assert "pack" in _one_line_usage_error(
      config.validate, _replace(base, data={"pack": True}))
  assert "inputs_length" in _one_line_usage_error(
      config.validate, _replace(base, data={"inputs_length": 0}))
  # Decoder-only models have no encoder input, so inputs_length is not checked.
  config.validate(_replace(base, model={"arch": "decoder"}, data={"inputs_length": 0}))


def test_validate_two_dims_of_one_tensor_on_one_axis(base):
  # wi is [d_model, d_ff]: mtf refuses to split both over "model"; so must we, early.
  bad = _replace(base, mesh={"layout": "batch:batch;d_model:model;d_ff:model"})
  message = _one_line_usage_error(config.validate, bad)
  assert "puts d_model and d_ff on mesh axis 'model'" in message


def test_unparsable_binding_is_named():
  message = _one_line_usage_error(config.load_experiment, TINY, ["ModelConfig.d_model = "])
  assert "ModelConfig.d_model = " in message


def test_search_path_is_added_once():
  import gin
  for _ in range(3):
    config.load_experiment(TINY)
  assert gin.config._LOCATION_PREFIXES.count(str(config.GIN_PARENT)) == 1


# --------------------------------------------------------------------------------------
# resolve_gin_file: gin files by file name, under the checkout's gin/, or as paths

@pytest.mark.parametrize("name,expected", [
    ("t5_small", "models/t5_small.gin"), ("t5_small.gin", "models/t5_small.gin"),
    ("data2_model2", "mesh/data2_model2.gin"), ("s4_m16", "pipeline/s4_m16.gin"),
    ("table1_local", "suites/table1_local.gin"),
    ("models/t5_small.gin", "models/t5_small.gin"),
    ("gin/models/t5_small.gin", "models/t5_small.gin"),
    ("gin/mesh/single.gin", "mesh/single.gin"),
])
def test_gin_files_resolve_from_any_directory(tmp_path, monkeypatch, name, expected):
  monkeypatch.chdir(tmp_path)  # not the repository: GIN_DIR is what counts
  assert config.resolve_gin_file(name) == (config.GIN_DIR / expected).resolve()


def test_the_gin_files_live_at_the_checkouts_top_level():
  """The design card's layout: gin/ beside tf_tput/ (setup.py maps it into the wheel;
  test_wheel_install.py checks the installed copy)."""
  assert config.GIN_DIR == config.GIN_PARENT / "gin" == tf_tput.REPO_ROOT / "gin"
  assert (config.GIN_PARENT / "tf_tput" / "config.py").is_file()
  assert not (tf_tput.PACKAGE_DIR / "gin").exists()
  assert sorted(p.name for p in config.GIN_DIR.iterdir() if p.is_dir()) == sorted(
      config.GIN_FOLDERS)


def test_both_forms_load_from_the_checkouts_root(monkeypatch):
  monkeypatch.chdir(tf_tput.REPO_ROOT)
  by_path = config.load_experiment(["gin/models/t5_tiny.gin"])
  by_name = config.load_experiment(["t5_tiny"])
  assert by_path.model == by_name.model and by_name.model.name == "t5_tiny"


def test_a_path_as_given_comes_first(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  mine = tmp_path / "t5_small.gin"
  mine.write_text("ModelConfig.d_model = 8\n")
  assert config.resolve_gin_file("t5_small.gin") == mine
  assert config.resolve_gin_file(str(mine)) == mine
  assert config.resolve_gin_file("t5_small") == config.GIN_DIR / "models" / "t5_small.gin"


def test_legacy_paths_and_bare_names_load_with_their_includes_elsewhere(
    tmp_path, monkeypatch, caplog):
  monkeypatch.chdir(tmp_path)
  legacy = config.load_experiment(["gin/models/t5_tiny.gin", "gin/mesh/data2_model2.gin"])
  bare = config.load_experiment(["t5_tiny", "data2_model2"])
  assert bare.model == legacy.model and bare.mesh == legacy.mesh
  assert bare.model.d_model == legacy.model.d_model > 0  # t5_common.gin was included
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]


@pytest.mark.parametrize("name", ["t5_nope", "t5_nope.gin", "models/t5_nope.gin",
                                  "gin/models/t5_nope.gin", "nowhere/t5_small"])
def test_an_unknown_gin_file_is_one_line_naming_it(name):
  message = _one_line_usage_error(config.resolve_gin_file, name)
  assert repr(name) in message and "t5_small" in message and "path" in message


def test_a_bare_name_in_several_folders_is_one_line_naming_them(tmp_path, monkeypatch):
  for folder in ("models", "mesh"):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "twice.gin").write_text("")
  (tmp_path / "suites").mkdir()
  (tmp_path / "suites" / "once.gin").write_text("")
  (tmp_path / "elsewhere").mkdir()
  monkeypatch.setattr(config, "GIN_DIR", tmp_path)
  monkeypatch.chdir(tmp_path / "elsewhere")
  message = _one_line_usage_error(config.resolve_gin_file, "twice")
  assert "'twice'" in message
  assert "models/twice.gin" in message and "mesh/twice.gin" in message
  assert config.resolve_gin_file("once.gin") == tmp_path / "suites" / "once.gin"


# --------------------------------------------------------------------------------------
# include lines: a cycle or a missing file is one line, before gin recurses

@pytest.mark.parametrize("files,cycle", [
    ({"self.gin": "include 'self.gin'\n"}, ["self.gin", "self.gin"]),
    ({"a.gin": "include 'b.gin'\n", "b.gin": "# b\ninclude \"a.gin\"\n"},
     ["a.gin", "b.gin", "a.gin"]),
    ({"top.gin": "include 'a.gin'\n", "a.gin": "include 'b.gin'\n",
      "b.gin": "include 'a.gin'\n"}, ["a.gin", "b.gin", "a.gin"]),
])
def test_an_include_cycle_is_one_line_naming_its_files(tmp_path, monkeypatch, files,
                                                       cycle):
  monkeypatch.chdir(tmp_path)
  for name, text in files.items():
    (tmp_path / name).write_text(text + "ModelConfig.d_model = 8\n")
  first = next(iter(files))
  message = _one_line_usage_error(config.load_experiment, [first])
  shown = " includes ".join(str(tmp_path / name) for name in cycle)
  assert f"include cycle: {shown};" in message, message


def test_a_missing_include_names_the_including_file_and_the_name(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.gin").write_text("include 'gin/models/t5_common.gin'\n"
                                     "include 'gin/models/nope.gin'\n")
  message = _one_line_usage_error(config.load_experiment, ["mine.gin"])
  assert f"{tmp_path / 'mine.gin'} includes 'gin/models/nope.gin', which is not found" \
      in message, message


def test_every_shipped_gin_file_has_its_includes():
  for path in sorted(config.GIN_DIR.glob("*/*.gin")):
    config.add_gin_search_path()
    config.check_includes(path)  # raises on a cycle or a missing file


def test_validate_bad_embedding(base):
  bad = _replace(base, model={"embedding": "lookup"})
  message = _one_line_usage_error(config.validate, bad)
  assert "'lookup'" in message and "one_hot" in message and "gather" in message
