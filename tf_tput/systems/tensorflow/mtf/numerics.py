"""mtf's numerics that do not depend on a framework, shared by the JAX and TF2 twins
of the model (jax/model.py, tensorflow/tf2/model.py): its constants, the initializer it gives
each variable, and the relative position buckets, which depend only on the lengths
and are computed in numpy at trace time."""

import math

import numpy as np

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
