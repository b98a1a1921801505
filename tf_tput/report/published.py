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

CITATION = ("Barham et al., Pathways: Asynchronous Distributed Dataflow for ML, "
            "MLSys 2022, arXiv:2203.12533")
HARDWARE = "TPUv3, 16 GB per accelerator"

# Table 1: T5 training throughput, tokens/s; JAX (multi-controller) and Pathways
# reached the same figures. Batch size and sequence length are not stated.
TABLE1_T5 = {
    # model: (parameters as published, TPU cores, JAX tokens/s, Pathways tokens/s)
    "t5_base": ("270M", 32, 618000, 618000),
    "t5_large": ("770M", 32, 90400, 90400),
    "t5_3b": ("3B", 512, 282800, 282800),
    "t5_11b": ("11B", 512, 84800, 84800),
}

# Table 2: the 3B decoder-only LM (62 layers, d_model 2048, d_ff 8192) on Pathways,
# SPMD against a GPipe-like pipeline of S stages x M micro-batches; tokens/s.
TABLE2_DECODER_3B = [
    # (config, stages, micro-batches, TPU cores, tokens/s)
    ("spmd", None, None, 128, 125700),
    ("pipeline", 4, 16, 128, 133700),
    ("pipeline", 8, 32, 128, 132700),
    ("pipeline", 16, 64, 128, 131400),
    ("pipeline", 16, 64, 512, 507800),
]
TABLE2_MODEL = "decoder_3b"

# §5.3: data parallel across two islands over the DCN, gradients reduced within each
# island over ICI first. The layer dimensions of 64B / 136B are not stated.
MULTI_ISLAND = {
    # model: (islands, TPU cores per island, bytes per reduction, fraction of
    # single-island throughput; 136B's is published as "about 0.97")
    "decoder_64b": (2, 512, 457e9, 0.972),
    "decoder_136b": (2, 1024, 1030e9, 0.97),
}

# Table 2's note: the pipeline across islands, its stage boundaries on the DCN.
MULTI_ISLAND_PIPELINE = {
    # model: (stages, micro-batches, islands, TPU cores per island, fraction of the
    # one-island row: the same 131.4k tokens/s as 128 cores in one island)
    "decoder_3b": (16, 64, 4, 32, 1.0),
}

# Fig. 6: the smallest computation (ms) at which Pathways matches JAX's throughput.
FIG6_CROSSOVER_MS = [
    # (hosts, TPUs, configuration, ms)
    (16, 128, "B", 2.3),
    (512, 2048, "A", 35),
]
# Fig. 5 is plotted only: the paper gives no table of its values.
FIG5_NOTE = ("Fig. 5's values are plotted only (no table): JAX OpByOp far ahead of "
             "every single-controller system; Pathways-F matches JAX up to about 1000 "
             "TPU cores; Ray about 10x slower per computation than Pathways.")


def table_row(r: dict):
  """(source, TPU cores, JAX tokens/s, Pathways tokens/s) published for a record's
  model name (and, for Table 2, its pipeline: stages x micro-batches, the core count
  where two rows share them), or None. Table 2 has Pathways figures only."""
  model = r["model"]
  if model in TABLE1_T5:
    _, cores, jax_tps, pathways_tps = TABLE1_T5[model]
    return "Table 1", cores, jax_tps, pathways_tps
  if model == TABLE2_MODEL:
    stages = r.get("pipeline_stages") or 1
    rows = [row for row in TABLE2_DECODER_3B
            if (row[1] or 1, row[2] or 1) == (stages, r.get("micro_batches") or 1)]
    rows.sort(key=lambda row: row[3] != r["num_devices"])  # the same core count first
    if rows:
      config, _, micro_batches, cores, tps = rows[0]
      label = "SPMD" if config == "spmd" else f"pipeline {stages}x{micro_batches}"
      return f"Table 2, {label}", cores, None, tps
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
