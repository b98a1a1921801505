"""tfds text through the Mesh TensorFlow baseline: padded and packed batches train, and
the variables mtf creates are the names and shapes tf_tput/models.py predicts (checked
on these trainers: each is an mtf graph built and lowered, 5-10 s).

In-process, with mtf's placement of every mesh slice on the one CPU (device "") so no
virtual devices are needed, and tfds's mock data in place of a downloaded dataset.
"""

import math

import pytest
import tensorflow_datasets as tfds

from tf_tput import config, data, models
from tf_tput.errors import UsageError
from tf_tput.runtime.topology import Topology
from tf_tput.systems.tensorflow.mtf import system as mtf

FOUR_SLICES_ON_ONE_CPU = Topology("tf", "cpu", ("",) * 4, "cpu")


def _mtf_variables(trainer) -> dict:
  """Names and shapes of mtf's master variables (the per-device "_slice_" copies
  PlacementMeshImpl makes are excluded)."""
  import tensorflow as tf
  with trainer._graph.as_default():
    return {v.name[:-len(":0")]: tuple(v.shape.as_list())
            for v in tf.compat.v1.trainable_variables() if "_slice_" not in v.name}


# Packed rows of a decoder through mtf: tests/unit/test_jax_model.py (against JAX's
# loss) and tests/integration/test_mtf_pipeline.py; its tfds packing: test_data.py.
# vocab 500 also pins the vocabulary padding (mtf pads to 512 as models does).
@pytest.mark.parametrize("model, pack, params", [
    ("t5_tiny", True, ()), ("decoder_tiny", False, ("ModelConfig.vocab_size = 500",))])
def test_tfds_batches_train_through_mtf_whose_variables_models_predicts(model, pack,
                                                                       params):
  experiment = config.load_experiment(
      [f"gin/models/{model}.gin", "gin/mesh/data2_model2.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       f"DataConfig.pack = {pack}", "DataConfig.inputs_length = 32",
       "DataConfig.targets_length = 32", "TrainConfig.global_batch = 4", *params])
  with tfds.testing.mock_data(num_examples=64):
    batches = data.batches(experiment)
    trainer = mtf.SYSTEM.build(experiment, FOUR_SLICES_ON_ONE_CPU)
    try:
      assert trainer.num_params == models.num_params(experiment.model)
      assert _mtf_variables(trainer) == {
          v.name: tuple(s for _, s in v.dims) for v in models.variables(experiment.model)}
      for _ in range(3):
        batch = next(batches)
        assert ("targets_segmentation" in batch) == pack
        tokens, positions = data.count_tokens(batch)
        assert 0 < tokens < positions  # byte texts leave padding; it is not counted
        assert math.isfinite(trainer.step(batch))
    finally:
      trainer.close()


def test_missing_tfds_dataset_fails_before_training(tmp_path):
  experiment = config.load_experiment(
      ["gin/models/decoder_tiny.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'no_such_dataset_xyz'",
       f"DataConfig.data_dir = '{tmp_path}'"])
  with pytest.raises(UsageError, match="no_such_dataset_xyz"):
    data.batches(experiment)


def test_wrong_text_key_fails_before_training():
  experiment = config.load_experiment(
      ["gin/models/decoder_tiny.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       "DataConfig.text_key = 'body'"])
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(UsageError, match="no feature 'body'.*'text'"):
      data.batches(experiment)
