"""tf_tput.plan: the arithmetic of any config, without building it. The CLI runs in
subprocesses; what needs no flags (the islands' mesh and bytes, the text) in-process."""

import json

import pytest

from tf_tput import config, models, plan as plan_lib
from tf_tput.errors import UsageError

from cli_helpers import run_cli

MODEL_FILES = sorted(p.name for p in (config.GIN_DIR / "models").glob("*.gin")
                     if not p.name.endswith("_common.gin"))


def test_every_model_file_is_planned():
  assert {"t5_small.gin", "decoder_136b.gin", "t5_tiny.gin"} <= set(MODEL_FILES)


@pytest.mark.parametrize("name", MODEL_FILES)
def test_plan_json_matches_the_model_arithmetic(name):
  proc = run_cli("tf_tput.plan", f"--gin_file=gin/models/{name}",
                 "--gin_file=gin/mesh/data2_model2.gin", "--format=json")
  assert proc.returncode == 0, proc.stderr
  plan = json.loads(proc.stdout)
  experiment = config.load_experiment([f"gin/models/{name}", "gin/mesh/data2_model2.gin"])
  assert plan["num_params"] == models.num_params(experiment.model)
  assert plan["model_flops_per_token"] == pytest.approx(models.model_flops_per_token(
      experiment.model, 128, 128))
  sharded = plan["bytes_per_device"]
  assert sharded == models.bytes_per_device(experiment.model, experiment.mesh_shape,
                                            experiment.layout)
  # A 2-way model axis halves the big matrices: state per device < unsharded state,
  # but no more than halves it.
  assert 2 * plan["num_params"] <= sharded["params"] < 4 * plan["num_params"]


def test_plan_text_and_bad_file():
  proc = run_cli("tf_tput.plan", "--gin_file=gin/models/decoder_136b.gin")
  assert proc.returncode == 0 and "136,292,097,024" in proc.stdout
  proc = run_cli("tf_tput.plan", "--gin_file=nope.gin")
  assert proc.returncode == 2 and proc.stderr.startswith("error: gin file 'nope.gin'")


def test_plan_of_the_papers_deepest_pipeline_per_stage():
  """decoder_3b at 16 stages x 64 micro-batches on 128 devices: a row per stage."""
  proc = run_cli("tf_tput.plan", "--gin_file=gin/models/decoder_3b.gin",
                 "--gin_file=gin/mesh/data8.gin", "--gin_file=gin/pipeline/s16_m64.gin",
                 "--gin_param=TrainConfig.global_batch = 2048",
                 "--gin_param=DataConfig.targets_length = 1024", "--format=json")
  assert proc.returncode == 0, proc.stderr
  plan = json.loads(proc.stdout)
  assert plan["num_devices"] == 128 and plan["pipeline_stages"] == 16
  assert plan["bubble_fraction"] == pytest.approx(15 / 79)
  stages = plan["stages"]
  assert [s["layers"][1] - s["layers"][0] for s in stages] == [3] + [4] * 14 + [3]
  # The embedding (and relative bias, 16 x 32) on the first stage, its softmax copy
  # (and the final norm, d_model) on the last.
  assert stages[0]["params"] - 16 * 32 == stages[-1]["params"] - 2048 > stages[1]["params"]
  assert all(s["total_bytes"] == s["param_bytes"] + s["optimizer_bytes"]
             + s["activation_bytes"] for s in stages)
  text = run_cli("tf_tput.plan", "--gin_file=gin/models/decoder_3b.gin",
                 "--gin_file=gin/mesh/data8.gin", "--gin_file=gin/pipeline/s16_m64.gin",
                 "--gin_param=TrainConfig.global_batch = 2048")
  assert "batch:8 per stage x 16 stages (128 devices)" in text.stdout
  assert "bubble (S-1)/(M+S-1) = 0.190" in text.stdout


def test_plan_projects_the_64b_model_across_two_islands_beside_the_paper():
  args = ["--gin_file=gin/models/decoder_64b.gin", "--islands=2",
          "--devices_per_island=512", "--gin_param=TrainConfig.global_batch = 1024",
          "--gin_param=DataConfig.targets_length = 2048"]
  proc = run_cli("tf_tput.plan", *args, "--format=json")
  assert proc.returncode == 0, proc.stderr
  projection = json.loads(proc.stdout)["islands"]
  assert projection["bytes_per_reduction"] == 2 * 4 * 64_689_022_976
  assert projection["assumptions"]["hosts_per_island"] == 128  # 4 chips per host
  assert 0 < projection["fraction_of_single_island"] < 1
  text = run_cli("tf_tput.plan", *args).stdout
  assert "published (§5.3)       2 x 512 cores: 457 GB per reduction, 0.972" in text
  # No mesh file: the plan's bytes are those of the 1024 devices it projects, and it
  # says what it assumed, naming the mesh file the islands_paper suite uses.
  assert "batch:1024 (1024 devices)" in text and "(1 devices)" not in text
  assert "assumed: 2 islands x 512 devices on the config's mesh batch:1" in text
  assert "(data64_model16) splits them otherwise" in text
  assert "per island             512 devices: " in text and "pipeline " not in text
  bad = run_cli("tf_tput.plan", *args, "--overlap=2")
  assert bad.returncode == 2 and "--overlap=2.0; it must be in [0, 1]" in bad.stderr


def test_plan_projects_the_papers_pipeline_across_four_islands():
  """Table 2's note: S=16, M=64 on 4 islands x 32 TPUv3 cores (8 per host)."""
  args = ["--gin_file=gin/models/decoder_3b.gin", "--gin_file=gin/mesh/data8.gin",
          "--gin_file=gin/pipeline/s16_m64.gin", "--gin_param=TrainConfig.global_batch = 2048",
          "--gin_param=DataConfig.targets_length = 1024",
          "--gin_param=ModelConfig.activation_dtype = 'bfloat16'", "--islands=4",
          "--devices_per_island=32", "--hosts_per_island=4", "--accelerator=tpu_v3"]
  proc = run_cli("tf_tput.plan", *args, "--format=json")
  assert proc.returncode == 0, proc.stderr
  projection = json.loads(proc.stdout)["islands"]
  micro = 2048 // 64 * 1024 * 2048 * 2  # a micro-batch's bfloat16 activations
  assert projection["micro_batch_bytes"] == micro
  assert projection["bytes_per_step"] == 3 * 2 * 64 * micro + 2 * 32128 * 2048 * 4
  assert 0.9 < projection["fraction_of_single_island"] < 1
  text = run_cli("tf_tput.plan", *args).stdout
  assert "4 of 16 stages each" in text and "published (Table 2)    S=16, M=64" in text
  bad = run_cli("tf_tput.plan", *args[:-4], "--islands=3", "--devices_per_island=32")
  assert bad.returncode == 2 and "multiple of 3" in bad.stderr


def test_fit_memory_plans_the_largest_batch_that_fits_and_refuses_what_cannot():
  args = ("--gin_file=t5_base", "--gin_param=ModelConfig.activation_dtype = 'bfloat16'")
  proc = run_cli("tf_tput.plan", *args, "--fit_memory_gib=40", "--format=json")
  assert proc.returncode == 0, proc.stderr
  plan = json.loads(proc.stdout)
  batch, limit = plan["global_batch"], 40 * 2**30
  assert batch > 8 and batch % 8 == 0  # doubled from the file's 8
  assert max(s["total_bytes"] for s in plan["stages"]) <= limit
  assert plan["fit"]["next_batch_bytes"] > limit  # twice the batch does not fit
  twice = json.loads(run_cli("tf_tput.plan", *args, "--format=json",
                             f"--gin_param=TrainConfig.global_batch = {2 * batch}").stdout)
  assert max(s["total_bytes"] for s in twice["stages"]) == plan["fit"]["next_batch_bytes"]
  for value, message in (("0.5", "already needs"), ("-1", "must be > 0"),
                         ("inf", "finite")):
    proc = run_cli("tf_tput.plan", *args, f"--fit_memory_gib={value}")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith(f"error: --fit_memory_gib={value}") and message in proc.stderr


GIN_64B = ["gin/models/decoder_64b.gin"]
PAPER_64B = ["TrainConfig.global_batch = 1024", "DataConfig.targets_length = 2048"]


def test_islands_plan_counts_the_devices_it_projects_not_the_configs_one():
  """docs/islands.md's example without a mesh file: 2 x 512 devices, not batch:1."""
  one = config.load_experiment(GIN_64B, PAPER_64B)
  projected, params, assumed = plan_lib.island_experiment(one, GIN_64B, PAPER_64B, 2, 512)
  assert projected.mesh.mesh_shape == "batch:1024" and projected.num_devices == 1024
  assert params[-1] == "MeshConfig.mesh_shape = 'batch:1024'"
  assert assumed == {"config_mesh_shape": "batch:1", "islands": 2, "devices_per_island": 512}
  single, p = plan_lib.plan(one)["stages"][0], plan_lib.plan(projected)
  device = p["stages"][0]
  # Data parallel: every device holds the whole state and 1/1024 of the activations.
  assert device["param_bytes"] == single["param_bytes"]
  assert device["activation_bytes"] == pytest.approx(single["activation_bytes"] / 1024,
                                                     rel=1e-3)
  (island, *rest) = plan_lib.island_bytes(p, 2)
  assert rest == [dict(island, island=1)]
  assert island["devices"] == 512 and island["bytes"] == 512 * device["total_bytes"]


def test_islands_plan_keeps_a_mesh_file_of_the_projected_devices():
  gin_files = GIN_64B + ["gin/mesh/data64_model16.gin"]
  e = config.load_experiment(gin_files, PAPER_64B)
  assert plan_lib.island_experiment(e, gin_files, PAPER_64B, 2, 512) == (e, PAPER_64B, None)
  device = plan_lib.plan(e)["stages"][0]
  # The model axis splits the big matrices 16 ways; the small ones stay whole.
  one = plan_lib.plan(config.load_experiment(GIN_64B, PAPER_64B))["stages"][0]
  assert one["param_bytes"] / 16 < device["param_bytes"] < one["param_bytes"] / 15


def test_islands_plan_names_a_device_count_the_mesh_cannot_fill():
  gin_files = GIN_64B + ["gin/mesh/data64_model16.gin"]
  e = config.load_experiment(gin_files, PAPER_64B)
  with pytest.raises(UsageError, match=r"^--devices_per_island=4: 2 x 4 devices are not a "
                     r"multiple of the 16 .* pass a mesh file of 8 devices"):
    plan_lib.island_mesh(e, 2, 4)
  with pytest.raises(UsageError, match=r"^--devices_per_island=512: the config's mesh "
                     r"'batch:1' scaled to 'batch:1024': batch = 8 is not divisible"):
    plan_lib.island_experiment(config.load_experiment(GIN_64B), GIN_64B, [], 2, 512)


def test_a_pipelines_islands_hold_their_stages():
  gin_files = ["gin/models/decoder_3b.gin", "gin/mesh/data8.gin", "gin/pipeline/s16_m64.gin"]
  params = ["TrainConfig.global_batch = 2048"]
  e = config.load_experiment(gin_files, params)
  assert plan_lib.island_mesh(e, 4, 32) is None
  assert plan_lib.island_mesh(e, 4, 64) == "batch:16"  # 16 stages x 16 devices
  p = plan_lib.plan(e)
  islands = plan_lib.island_bytes(p, 4)
  assert [i["stages"] for i in islands] == [list(range(k, k + 4)) for k in (0, 4, 8, 12)]
  rows = p["stages"]
  assert islands[3]["bytes"] == 8 * sum(r["total_bytes"] for r in rows[12:])
  assert islands[3]["device_bytes"] == rows[15]["total_bytes"]


def test_text_has_no_pipeline_rows_without_a_pipeline():
  text = plan_lib.format_text(plan_lib.plan(config.load_experiment(["gin/models/t5_small.gin"])))
  assert "\npipeline " not in text and "bubble" not in text and "per stage" not in text
  assert "bytes per device       params 0.23 GiB + Adafactor 0.00 GiB + activations*" in text
