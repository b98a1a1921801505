"""Framework-neutral numerics: mtf's that need no framework, in one home for the
models that port it (systems/jax/model.py, tensorflow/tf2/model.py, torch/model.py,
and their trainers): its constants, the initializer it gives each variable, the
relative position buckets (which depend only on the lengths and are computed in
numpy at trace time), the sequence ids, AdafactorOptimizer's defaults and
schedules, and the check that load_variables is given the model's variables.

What needs a framework's ops takes them as arguments (rsqrt, minimum): the formula
lives here, each model supplies the ops that give mtf's float32 arithmetic."""

import math
from typing import Optional

import numpy as np

from tf_tput import models
from tf_tput.config import ModelConfig

RMS_NORM_EPSILON = 1e-6       # transformer.sublayer_rms_norm
Z_LOSS = 1e-4                 # Unitransformer(z_loss=1e-4), applied in training mode
MASK_BIAS = -1e9              # attention.visibility_mask_to_attention_bias
RELATIVE_MAX_DISTANCE = 128   # transformer_layers._relative_position_bucket default


def relative_position_bucket(relative_position, bidirectional, num_buckets,
                             max_distance=RELATIVE_MAX_DISTANCE):
  """transformer_layers._relative_position_bucket, in numpy float32 at trace time.

  Positions are indices (mtf drops "position" without positional embeddings), so the
  buckets depend only on the lengths. The float32 arithmetic is mtf's lowering: a
  division by a Python number is a multiplication by its reciprocal (ops.divide),
  then truncation to int32. The log ratio is a whole number at |n| = 16, 32, 64, where
  rounding could move a bucket; tests pin this table against mtf's own lowering.
  """
  n = -relative_position
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore"):  # log(0) where n is small; that branch is unused
    ratio = np.log(n.astype(np.float32) * np.float32(1.0 / max_exact))
  scaled = (ratio * np.float32(1.0 / math.log(max_distance / max_exact))
            * np.float32(num_buckets - max_exact))
  val_if_large = max_exact + np.where(n < max_exact, 0, scaled).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  return (ret + np.where(n < max_exact, n, val_if_large)).astype(np.int32)


def initializer(name: str, shape: tuple, m: ModelConfig):
  """The initializer mtf gives this variable: (kind, scale)."""
  leaf = name.rsplit("/", 1)[-1]
  if leaf == "scale":      # sublayer_rms_norm: tf.ones_initializer
    return "ones", 1.0
  if leaf == "embedding":  # layers.embedding_weights: tf.random_normal_initializer()
    return "normal", 1.0
  # AttentionParams.init_weights. fold_scaling_into_initializer: the attention's
  # 1/sqrt(d_kv) lives in q's initializer, not in the computation.
  if leaf == "q":
    return "normal", (m.d_model * m.d_kv) ** -0.5
  if leaf in ("k", "v"):
    return "normal", m.d_model ** -0.5
  if leaf == "o":
    return "normal", (m.num_heads * m.d_kv) ** -0.5
  if leaf == "kernel":
    # layers.dense: VarianceScalingInitializer(1.0, "fan_in", "normal"), which is
    # tf.truncated_normal_initializer(fan_in**-0.5): cut at 2 stddev, no variance
    # correction (the actual stddev is 0.88 of it).
    return "truncated_normal", shape[0] ** -0.5
  if leaf == "relative_attention_bias":
    # mtf.get_variable with no initializer gets TF's default, glorot_uniform:
    # limit sqrt(6 / (fan_in + fan_out)) with fan_in, fan_out = heads, buckets.
    return "glorot_uniform", math.sqrt(6.0 / sum(shape))
  raise ValueError(f"no initializer known for {name}")


def sequence_id_of(batch: dict, key: str, ids, minimum):
  """The sequence ids of feature `key` (mtf's {inputs,targets}_segmentation): packed
  rows carry "{key}_segmentation"; otherwise padding (id 0) is its own sequence,
  minimum(ids, 1). The caller casts to int32 in its framework."""
  segmentation = f"{key}_segmentation"
  return batch[segmentation] if segmentation in batch else minimum(ids, 1)


# mtf.optimize.AdafactorOptimizer() with its defaults (beta1 0, factored,
# multiply_by_parameter_scale, decay adafactor_decay_rate_pow(0.8)).
ADAFACTOR_EPSILON1 = 1e-30            # added to grad^2 before the second moment
ADAFACTOR_EPSILON2 = 1e-3             # the least parameter scale the update is scaled by
ADAFACTOR_CLIPPING_THRESHOLD = 1.0    # the update's RMS is clipped to this
ADAFACTOR_DECAY_EXPONENT = 0.8        # decay 1 - (step + 1)^-0.8
ADAFACTOR_MAX_LEARNING_RATE = 0.01    # _learning_rate_default: min(rsqrt(step + 1), 0.01)


def factored_dims(shape: tuple) -> Optional[tuple]:
  """AdafactorOptimizer._factored_dims: the axes of the two largest dimensions (largest
  first, the earlier on ties: Python's sort is stable), when both are at least
  ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR; else None (a full second moment)."""
  if len(shape) < 2:
    return None
  by_size = sorted(range(len(shape)), key=lambda axis: -shape[axis])
  if shape[by_size[1]] < models.ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR:
    return None
  return by_size[0], by_size[1]


def adafactor_learning_rate(step, rsqrt, minimum):
  """AdafactorOptimizer._learning_rate_default: min(rsqrt(step + 1), 0.01), with the
  caller's rsqrt (not 1 / sqrt: mtf's op) on its float32 step. Step k is the global
  step the update reads (mtf's trainer increments it after the update)."""
  return minimum(rsqrt(step + 1.0), ADAFACTOR_MAX_LEARNING_RATE)


def adafactor_decay_rate(step):
  """optimize.adafactor_decay_rate_pow(exponent=0.8, offset=0): 1 - (step + 1)^-0.8, on
  a float32 step tensor, whose ** is its framework's pow (mtf's tf.pow)."""
  return 1.0 - (step + 1.0) ** -ADAFACTOR_DECAY_EXPONENT


def check_variable_names(expected, values: dict) -> None:
  """load_variables' check: `values` names exactly the model's variables `expected`."""
  mismatched = set(expected) ^ set(values)
  if mismatched:
    raise ValueError(f"variables differ from the model's: {sorted(mismatched)[:5]}")
