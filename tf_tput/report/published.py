"""The figures the Pathways paper published, copied into the package.

Barham et al., "Pathways: Asynchronous Distributed Dataflow for ML", MLSys 2022,
arXiv:2203.12533. Copied from the project's reference file
(shared/reference/pathways_2022.json: figures as published, read from a full
translation of the paper and an independent summary that agree; check against the
arXiv PDF before quoting). The package reads nothing outside the repository at run
time; tests/unit/test_report.py checks this copy against that file where it exists.

They were measured on TPUv3 at the device counts given here, so reports print them
in their own columns, labelled, never as a ratio against local runs. implied_mfu
derives what each figure means as MFU under this project's FLOPs convention.
"""

import functools
from typing import NamedTuple, Optional

CITATION = ("Barham et al., Pathways: Asynchronous Distributed Dataflow for ML, "
            "MLSys 2022, arXiv:2203.12533")
HARDWARE = "TPUv3, 16 GB per accelerator"


class T5Row(NamedTuple):
  """Table 1: a T5 model's training throughput; JAX (multi-controller) and Pathways
  reached the same figures. Batch size and sequence length are not stated."""
  params: str                   # parameters, as published ("270M")
  cores: int                    # TPU cores
  jax_tokens_per_sec: int
  pathways_tokens_per_sec: int


class DecoderRow(NamedTuple):
  """Table 2: the 3B decoder-only LM on Pathways, SPMD or a GPipe-like pipeline."""
  config: str                   # "spmd" or "pipeline"
  stages: Optional[int]         # S (None for SPMD)
  micro_batches: Optional[int]  # M (None for SPMD)
  cores: int                    # TPU cores
  tokens_per_sec: int


class IslandsRow(NamedTuple):
  """§5.3: data parallel across islands over the DCN."""
  islands: int
  cores_per_island: int
  bytes_per_reduction: float
  fraction: float               # of single-island throughput


class IslandsPipelineRow(NamedTuple):
  """Table 2's note: a pipeline across islands, its stage boundaries on the DCN."""
  stages: int
  micro_batches: int
  islands: int
  cores_per_island: int
  fraction: float               # of the same pipeline's one-island throughput


class CrossoverRow(NamedTuple):
  """Fig. 6: the smallest computation at which Pathways matches JAX's throughput."""
  hosts: int
  tpus: int
  config: str                   # the paper's hardware configuration, "A" or "B"
  ms: float


class Figure(NamedTuple):
  """What the paper published for one local record's configuration (table_row)."""
  source: str                   # "Table 1", "Table 2, SPMD", "Table 2, pipeline 4x16"
  cores: int                    # TPU cores
  jax_tokens_per_sec: Optional[int]  # Table 1 only
  pathways_tokens_per_sec: int


TABLE1_T5 = {
    "t5_base": T5Row("270M", 32, 618000, 618000),
    "t5_large": T5Row("770M", 32, 90400, 90400),
    "t5_3b": T5Row("3B", 512, 282800, 282800),
    "t5_11b": T5Row("11B", 512, 84800, 84800),
}

# The 3B decoder: 62 layers, d_model 2048, d_ff 8192; S stages x M micro-batches.
TABLE2_DECODER_3B = [
    DecoderRow("spmd", None, None, 128, 125700),
    DecoderRow("pipeline", 4, 16, 128, 133700),
    DecoderRow("pipeline", 8, 32, 128, 132700),
    DecoderRow("pipeline", 16, 64, 128, 131400),
    DecoderRow("pipeline", 16, 64, 512, 507800),
]
TABLE2_MODEL = "decoder_3b"

# Gradients reduced within each island over ICI first. The layer dimensions of 64B /
# 136B are not stated; 136B's fraction is published as "about 0.97".
MULTI_ISLAND = {
    "decoder_64b": IslandsRow(2, 512, 457e9, 0.972),
    "decoder_136b": IslandsRow(2, 1024, 1030e9, 0.97),
}

# 3B's fraction: the same 131.4k tokens/s as 128 cores in one island.
MULTI_ISLAND_PIPELINE = {
    "decoder_3b": IslandsPipelineRow(16, 64, 4, 32, 1.0),
}

FIG6_CROSSOVER_MS = [
    CrossoverRow(16, 128, "B", 2.3),
    CrossoverRow(512, 2048, "A", 35),
]
# Fig. 5 is plotted only: the paper gives no table of its values.
FIG5_NOTE = ("Fig. 5's values are plotted only (no table): JAX OpByOp far ahead of "
             "every single-controller system; Pathways-F matches JAX up to about 1000 "
             "TPU cores; Ray about 10x slower per computation than Pathways.")


def table_row(r: dict) -> Optional[Figure]:
  """The Figure published for a record's model name (and, for Table 2, its
  pipeline: stages x micro-batches, the core count where two rows share them), or
  None. Table 2 has Pathways figures only."""
  model = r["model"]
  if model in TABLE1_T5:
    row = TABLE1_T5[model]
    return Figure("Table 1", row.cores, row.jax_tokens_per_sec, row.pathways_tokens_per_sec)
  if model == TABLE2_MODEL:
    stages = r.get("pipeline_stages") or 1
    rows = [row for row in TABLE2_DECODER_3B
            if (row.stages or 1, row.micro_batches or 1)
            == (stages, r.get("micro_batches") or 1)]
    rows.sort(key=lambda row: row.cores != r["num_devices"])  # the same core count first
    if rows:
      row = rows[0]
      label = "SPMD" if row.config == "spmd" else f"pipeline {stages}x{row.micro_batches}"
      return Figure(f"Table 2, {label}", row.cores, None, row.tokens_per_sec)
  return None


# The suites that set the paper's runs up at its scale choose the sequence lengths the
# paper does not state; implied MFU uses the same ones.
PAPER_SUITES = {**{model: "table1_paper" for model in TABLE1_T5},
                TABLE2_MODEL: "table2_paper"}
TPU_PEAK_KEY = ("tpu_v3", "bfloat16")  # the paper's chips, trained in bfloat16


@functools.lru_cache(maxsize=None)
def paper_flops_per_token(model: str) -> tuple:
  """(model FLOPs per token, inputs_length, targets_length) of a published model at
  the lengths its paper suite binds (gin files only; no framework is imported)."""
  from tf_tput import GIN_DIR, config, models, suite

  matrix = next(m for m in suite.load(PAPER_SUITES[model]).matrices if model in m.models)
  experiment = config.load_experiment([str(GIN_DIR / "models" / f"{model}.gin")],
                                      matrix.gin_params)
  data = experiment.data
  return (models.model_flops_per_token(experiment.model, data.inputs_length,
                                       data.targets_length),
          data.inputs_length if experiment.model.arch == "encoder_decoder" else None,
          data.targets_length)


def implied_mfu(model: str, tokens_per_sec: float, cores: int) -> float:
  """A published figure as MFU on TPUv3: tokens/s x model FLOPs per token (this
  project's convention, at the paper suite's lengths) / (cores x peak per core)."""
  from tf_tput.measure import peak

  return (tokens_per_sec * paper_flops_per_token(model)[0]
          / (cores * peak.PEAK_FLOPS[TPU_PEAK_KEY]))


# A published figure's MFU is derived here, not published: its label says so.
IMPLIED_MFU = "implied MFU (derived)"


def implied_mfu_cell(model: str, tokens_per_sec: float, cores: int) -> str:
  """implied_mfu as a table cell: '21.4%'."""
  return f"{100 * implied_mfu(model, tokens_per_sec, cores):.1f}%"
