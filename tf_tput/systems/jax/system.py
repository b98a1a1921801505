"""--system=jax: the same gin model in JAX, sharded by the same Mesh TensorFlow layout.

This module is the System: which trainer a config gets. trainer.py trains one
mesh (SPMD: data and model axes), islands.py data parallel across islands with a
hierarchical reduction, pipeline.py a GPipe pipeline over a 'stage' mesh axis.
Each is imported only when chosen; none imports this module.
"""

from tf_tput import systems
from tf_tput.systems.jax import runtime as jax_runtime


class JaxSystem(systems.System):
  name = "jax"
  runtime = jax_runtime.RUNTIME
  distributions = {"jax": ("jax",)}
  multi_process = True   # every launched process runs the same program
  strategies = ("local",)  # processes come from tf_tput.launch --num_processes
  every_worker = False
  embeddings = ("one_hot", "gather")
  pipelines = True       # GPipe over a 'stage' mesh axis: systems/jax/pipeline.py
  islands = ("data", "pipeline")  # data parallel across and inside --islands
  # (islands.py), or a pipeline's stages split across them (pipeline.py)
  traces = ()
  scans_layers = True    # ModelConfig.scan_layers: lax.scan over each stack (model.py)

  def check(self, experiment, strategy: str) -> None:
    """Every mesh and strategy it lists trains (config.validate checks the mesh)."""

  def build(self, experiment, topology):
    if experiment.pipelined:
      from tf_tput.systems.jax.pipeline import JaxPipelineTrainer
      return JaxPipelineTrainer(experiment, topology)
    if topology.islands:  # K >= 1: the same reduction for one island as for several
      from tf_tput.systems.jax.islands import JaxIslandTrainer
      return JaxIslandTrainer(experiment, topology)
    from tf_tput.systems.jax.trainer import JaxTrainer
    return JaxTrainer(experiment, topology)


SYSTEM = JaxSystem()
