"""--system=mtf: the TensorFlow baseline, Mesh TensorFlow's transformer in a TF1 graph.

The model is built from mesh_tensorflow.transformer's own classes (Bitransformer for
T5, a causal Unitransformer for decoder-only LMs) with the layer stack that
mesh_tensorflow/transformer/gin/defaults.gin binds, passed explicitly here so that
mtf's gin registry stays out of the user's gin files. Training is mtf's
AdafactorOptimizer with its defaults (relative step size min(0.01, rsqrt(step + 1)),
parameter scaling, factored second moments), lowered by PlacementMeshImpl onto the
topology's devices (this process's, or every worker's of a TF_CONFIG cluster) and run
by one tf.compat.v1 Session: a single controller. On TPUs, tpu.py lowers the same
model with the SIMD implementation. With PipelineConfig.stages > 1 the same layers
train as a GPipe pipeline, one mesh per stage (pipeline.py); across islands the
gradients are reduced hierarchically (islands.py).
"""

from tf_tput import errors, systems
from tf_tput.systems.tensorflow import runtime as tf_runtime


class MtfSystem(systems.System):
  name = "mtf"
  runtime = tf_runtime.RUNTIME
  distributions = {"tensorflow": ("tensorflow", "tensorflow-cpu"),
                   "mesh_tensorflow": ("mesh-tensorflow",)}
  multi_process = False  # one Session drives every device: a single controller
  strategies = ("local", "multi_worker", "tpu")
  every_worker = False  # the chief drives tf_server workers
  embeddings = ("one_hot",)  # mtf.gather is a one-hot einsum; mtf has no row lookup
  pipelines = True  # on Session devices (pipeline.py); the TPU path does not
  islands = ("data", "model", "pipeline")  # TF workers in islands: a hierarchical
  # reduction, or a pipeline's stages split across them (pipeline.py)
  traces = ("local", "multi_worker")  # a Session step under TF's full trace

  def check(self, experiment, strategy: str) -> None:
    if strategy == "tpu" and experiment.pipelined:  # the TPU program is one SIMD mesh
      raise errors.UsageError(
          f"--strategy=tpu (mtf's SIMD mesh) does not pipeline; PipelineConfig.stages = "
          f"{experiment.pipeline.stages} runs under --system=mtf on CPUs/GPUs (one "
          "Session) or under --system=jax on TPUs")

  def build(self, experiment, topology):
    if topology.platform == "tpu":
      if experiment.pipelined:
        raise errors.UsageError(
            f"PipelineConfig.stages = {experiment.pipeline.stages}: --system=mtf on "
            "TPUs (--strategy=tpu) does not pipeline; use stages = 1 there")
      from tf_tput.systems.tensorflow.mtf.tpu import MtfTpuTrainer
      return MtfTpuTrainer(experiment, topology)
    if experiment.pipelined:
      from tf_tput.systems.tensorflow.mtf.pipeline import MtfPipelineTrainer
      return MtfPipelineTrainer(experiment, topology)
    from tf_tput.systems.tensorflow.mtf.trainer import MtfTrainer
    return MtfTrainer(experiment, topology)


SYSTEM = MtfSystem()
