"""tfds text through the Mesh TensorFlow baseline: padded and packed batches train.

In-process, with mtf's placement of every mesh slice on the one CPU (device "") so no
virtual devices are needed, and tfds's mock data in place of a downloaded dataset.
"""

import math

import pytest
import tensorflow_datasets as tfds

from tf_tput import config, data, models
from tf_tput.errors import UsageError
from tf_tput.systems import mtf
from tf_tput.runtime.topology import Topology

FOUR_SLICES_ON_ONE_CPU = Topology("tf", "cpu", ("",) * 4, "cpu")


@pytest.mark.parametrize("model, pack", [("t5_tiny", True), ("decoder_tiny", False),
                                         ("decoder_tiny", True)])
def test_tfds_batches_train_through_mtf(model, pack):
  experiment = config.load_experiment(
      [f"gin/models/{model}.gin", "gin/mesh/data2_model2.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       f"DataConfig.pack = {pack}", "DataConfig.inputs_length = 32",
       "DataConfig.targets_length = 32", "TrainConfig.global_batch = 4"])
  with tfds.testing.mock_data(num_examples=64):
    batches = data.batches(experiment)
    trainer = mtf.SYSTEM.build(experiment, FOUR_SLICES_ON_ONE_CPU)
    try:
      assert trainer.num_params == models.num_params(experiment.model)
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
