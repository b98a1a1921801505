"""The TensorFlow 2 twin of the model tf_tput/systems/tensorflow/mtf/model.py builds with mesh_tensorflow.

A function-by-function port of tf_tput/systems/jax/model.py (which is checked against
mesh_tensorflow.transformer itself) to plain TF2 ops: functions over a flat dict of
tensors named and shaped exactly as tf_tput.models.variables (mtf's variable names),
so that weights exported from the mtf trainer load as they are and give its loss:

* T5 v1.0 Bitransformer (arch "encoder_decoder") and a causal Unitransformer LM
  (arch "decoder"): pre-norm RMS norm, ReLU FFN, one relative attention bias per
  stack, embedding shared with the softmax (scaled by d_model**-0.5);
* mtf's AdafactorOptimizer with its defaults, written out here (Adafactor below).

Each function names the mtf function it mirrors (mesh_tensorflow/transformer/*.py,
layers.py, ops.py, optimize.py are the specification); where jax/model.py notes that the
order of operations or the dtype matters, the same order and dtype are kept. No Keras:
system.py holds the tf.Variables and runs these functions under a tf.distribute strategy.
"""

from typing import Optional

import numpy as np
import tensorflow as tf

from tf_tput import models
from tf_tput.config import ModelConfig
from tf_tput.numerics import (
    ADAFACTOR_CLIPPING_THRESHOLD, ADAFACTOR_EPSILON1, ADAFACTOR_EPSILON2, MASK_BIAS,
    RMS_NORM_EPSILON, Z_LOSS, adafactor_decay_rate, adafactor_learning_rate,
    factored_dims, initializer, relative_position_bucket, sequence_id_of)


# --------------------------------------------------------------------------------------
# Parameters.

def init_params(m: ModelConfig, seed: int) -> dict:
  """Fresh float32 values, {mtf variable name: tf.Tensor}, initialized as mtf does
  (the same distributions; not mtf's random numbers)."""
  params = {}
  for index, v in enumerate(models.variables(m)):
    shape = tuple(size for _, size in v.dims)
    kind, scale = initializer(v.name, shape, m)
    key = (seed, index)
    if kind == "ones":
      value = tf.ones(shape, tf.float32)
    elif kind == "normal":
      value = scale * tf.random.stateless_normal(shape, key, dtype=tf.float32)
    elif kind == "truncated_normal":
      value = scale * tf.random.stateless_truncated_normal(shape, key, dtype=tf.float32)
    else:
      value = tf.random.stateless_uniform(shape, key, -scale, scale, dtype=tf.float32)
    params[v.name] = value
  return params


# --------------------------------------------------------------------------------------
# Building blocks.

def _logsumexp(x):
  """mtf.reduce_logsumexp over the last axis (keeps it): log(sum(exp(x - max))) + max."""
  max_x = tf.stop_gradient(tf.reduce_max(x, axis=-1, keepdims=True))
  return tf.math.log(tf.reduce_sum(tf.exp(x - max_x), axis=-1, keepdims=True)) + max_x


def _softmax(x):
  """mtf.softmax: exp(x - logsumexp(x)), not exp(x - max) / sum."""
  return tf.exp(x - _logsumexp(x))


def _rms_norm(x, scale):
  """transformer.sublayer_rms_norm: x * rsqrt(mean(x^2) + eps) * scale; the mean is
  reduce_sum times the Python float 1/n, as mtf.reduce_mean computes it."""
  variance = tf.reduce_sum(tf.square(x), axis=-1, keepdims=True) * (1.0 / x.shape[-1])
  return x * tf.math.rsqrt(variance + RMS_NORM_EPSILON) * scale


def _mask_bias(visible, dtype):
  """attention.visibility_mask_to_attention_bias: cast(not visible) * -1e9."""
  return tf.cast(tf.logical_not(visible), dtype) * MASK_BIAS


def _attention(p, prefix, x, memory, bias, m):
  """transformer_layers.SelfAttention / enc_dec_attention with attention.attention.

  The "heads" dimension (num_heads * d_kv) splits into [heads, d_kv], heads major.
  Logits and softmax in float32 (float32_logits=True), the weights cast back to the
  values' dtype; no 1/sqrt(d_kv) at runtime (it is in q's initializer).
  """
  heads, d_kv = m.num_heads, m.d_kv
  batch, length = tf.shape(x)[0], x.shape[1]
  memory_length = memory.shape[1]
  q = tf.reshape(tf.einsum("bld,dk->blk", x, p[f"{prefix}/q"]),
                 [batch, length, heads, d_kv])
  k = tf.reshape(tf.einsum("bmd,dk->bmk", memory, p[f"{prefix}/k"]),
                 [batch, memory_length, heads, d_kv])
  v = tf.reshape(tf.einsum("bmd,dk->bmk", memory, p[f"{prefix}/v"]),
                 [batch, memory_length, heads, d_kv])
  logits = tf.einsum("blhk,bmhk->bhlm", tf.cast(q, tf.float32), tf.cast(k, tf.float32))
  logits = logits + tf.cast(bias, tf.float32)
  weights = tf.cast(_softmax(logits), v.dtype)
  o = tf.reshape(tf.einsum("bhlm,bmhk->blhk", weights, v), [batch, length, heads * d_kv])
  return tf.einsum("blk,kd->bld", o, p[f"{prefix}/o"])


def _dense_relu_dense(p, prefix, x):
  """transformer_layers.DenseReluDense: relu(x @ wi) @ wo, no biases."""
  h = tf.nn.relu(tf.einsum("bld,df->blf", x, p[f"{prefix}/wi/kernel"]))
  return tf.einsum("blf,fd->bld", h, p[f"{prefix}/wo/kernel"])


def _self_attention_bias(p, stack, sequence_id, causal, m, dtype):
  """SelfAttention.compute_bias: [batch, heads, length, memory_length], in dtype.

  In mtf's order: the causal mask (memory position <= query position), the
  sequence-id mask (equal ids; padding id 0 sees padding), the relative bias
  "bias_shared" (one [heads, buckets] variable per stack, block_000's, every layer).
  """
  length = sequence_id.shape[1]
  position = np.arange(length, dtype=np.int32)
  relative_position = position[None, :] - position[:, None]   # memory - query
  bias = tf.zeros([], dtype)
  if causal:
    bias = bias + _mask_bias(tf.constant(relative_position <= 0), dtype)[None, None]
  same_sequence = sequence_id[:, :, None] == sequence_id[:, None, :]
  bias = bias + _mask_bias(same_sequence, dtype)[:, None]
  buckets = relative_position_bucket(
      relative_position, bidirectional=not causal,
      num_buckets=m.relative_attention_num_buckets)
  values = p[models.relative_bias_name(stack)]
  if m.embedding == "one_hot":  # mtf.gather: one_hot(buckets) @ values
    one_hot = tf.one_hot(buckets, values.shape[1], dtype=values.dtype)
    return bias + tf.einsum("lmb,hb->hlm", one_hot, values)[None]
  return bias + tf.gather(values, buckets, axis=1)[None]


def _stack(p, stack, x, sequence_id, m, causal, encoder_output=None,
           encoder_sequence_id=None):
  """transformer.LayerStack.call with defaults.gin's sublayers (dropout rate 0):
  per layer rms_norm, mask padding, the layer, residual; then rms_norm and the mask."""
  dtype = x.dtype
  nonpadding = tf.cast(sequence_id != 0, dtype)[:, :, None]
  self_bias = _self_attention_bias(p, stack, sequence_id, causal, m, dtype)
  if encoder_output is not None:   # transformer_layers.enc_dec_attention_bias
    enc_dec_bias = _mask_bias(
        sequence_id[:, :, None] == encoder_sequence_id[:, None, :], dtype)[:, None]
  kinds = models.sublayers(with_enc_dec_attention=encoder_output is not None)
  for block in range(m.num_layers):
    for index, kind in enumerate(kinds):
      prefix = f"{models.block_name(stack, block)}/{models.layer_name(index)}"
      h = _rms_norm(x, p[f"{prefix}/rms_norm/scale"]) * nonpadding
      if kind == "SelfAttention":
        h = _attention(p, f"{prefix}/{kind}", h, h, self_bias, m)
      elif kind == "EncDecAttention":
        h = _attention(p, f"{prefix}/{kind}", h, encoder_output, enc_dec_bias, m)
      else:
        h = _dense_relu_dense(p, f"{prefix}/{kind}", h)
      x = x + h
  return _rms_norm(x, p[f"{stack}/rms_norm/scale"]) * nonpadding


def _shift_right(x):
  return tf.pad(x[:, :-1], [[0, 0], [1, 0]])


def autoregressive_inputs(targets, sequence_id):
  """transformer.autoregressive_inputs: targets shifted right, 0 where a sequence starts."""
  inputs = tf.abs(_shift_right(targets))
  return inputs * tf.cast(sequence_id == _shift_right(sequence_id), inputs.dtype)


def _embed(embedding, ids, method: str):
  """VocabEmbedding.ids_to_embedding. one_hot is mtf.gather's arithmetic (a one-hot
  [batch, length, vocab] in the activation dtype times the embedding, and a dense
  matmul for its gradient); gather is a row lookup with the same values."""
  if method == "one_hot":
    one_hot = tf.one_hot(ids, embedding.shape[0], dtype=embedding.dtype)
    return tf.einsum("blv,vd->bld", one_hot, embedding)
  return tf.gather(embedding, ids, axis=0)


def _loss(embedding, x, targets, denominator):
  """VocabEmbedding.hidden_to_logits + Unitransformer._compute_loss.

  Logits over the padded vocabulary from x * d_model**-0.5;
  layers.softmax_cross_entropy_with_logits against a one-hot in the activation dtype,
  plus z_loss * log_z^2; weighted by targets > 0, summed, times 1 / denominator
  (Unitransformer.loss_denominator: the global batch * length), in the activation dtype.
  """
  dtype = x.dtype
  x = x * (x.shape[-1] ** -0.5)
  logits = tf.einsum("bld,vd->blv", x, embedding)
  log_z = _logsumexp(logits)
  soft_targets = tf.one_hot(targets, logits.shape[-1], dtype=dtype)
  loss = -tf.reduce_sum((logits - log_z) * soft_targets, axis=-1)
  loss = loss + tf.square(log_z[..., 0]) * Z_LOSS
  weights = tf.cast(targets > 0, dtype)
  return tf.reduce_sum(loss * weights) * (1.0 / denominator)


def _sequence_id(batch, key, ids):
  return tf.cast(sequence_id_of(batch, key, ids, tf.minimum), tf.int32)


def loss_fn(params: dict, batch: dict, m: ModelConfig,
            denominator: Optional[int] = None) -> tf.Tensor:
  """jax/model.py's loss_fn: the loss mtf's call_simple(compute_loss=True, mode="train")
  returns, as float32.

  batch: int32 "targets" [B, Lt] (and "inputs" [B, Li] for encoder_decoder), optional
  "{inputs,targets}_segmentation". denominator: mtf's loss denominator, the global
  batch's targets.size; a replica's slice passes the global one, so the replicas'
  losses sum to the global batch's loss. Variables are cast once to the activation
  dtype, as mtf's Variable lowering does.
  """
  dtype = tf.as_dtype(m.activation_dtype)
  p = {name: tf.cast(value, dtype) for name, value in params.items()}
  targets = tf.cast(batch["targets"], tf.int32)
  if denominator is None:
    denominator = int(np.prod(targets.shape))
  targets_sequence_id = _sequence_id(batch, "targets", targets)
  decoder_inputs = autoregressive_inputs(targets, targets_sequence_id)
  if m.arch == "decoder":  # a causal Unitransformer named "decoder" (systems/tensorflow/mtf/model.py)
    embedding = p["decoder/embedding"]
    x = _stack(p, "decoder", _embed(embedding, decoder_inputs, m.embedding),
               targets_sequence_id, m, causal=True)
    return tf.cast(_loss(embedding, x, targets, denominator), tf.float32)
  # transformer.Bitransformer.call_simple: encoder, then the decoder attending to it.
  embedding = p["shared/embedding"]
  inputs = tf.cast(batch["inputs"], tf.int32)
  inputs_sequence_id = _sequence_id(batch, "inputs", inputs)
  encoder_output = _stack(p, "encoder", _embed(embedding, inputs, m.embedding),
                          inputs_sequence_id, m, causal=False)
  x = _stack(p, "decoder", _embed(embedding, decoder_inputs, m.embedding),
             targets_sequence_id, m, causal=True,
             encoder_output=encoder_output, encoder_sequence_id=inputs_sequence_id)
  return tf.cast(_loss(embedding, x, targets, denominator), tf.float32)


# --------------------------------------------------------------------------------------
# Optimizer.

def _reduce_rms(x):
  """optimize.reduce_rms: sqrt(mtf.reduce_mean(x^2)), the mean a sum times 1 / size."""
  return tf.sqrt(tf.reduce_sum(tf.square(x)) * (1.0 / int(np.prod(x.shape))))


def learning_rate(step):
  """numerics.adafactor_learning_rate of the global step (any integer or tensor)."""
  return adafactor_learning_rate(tf.cast(step, tf.float32), tf.math.rsqrt, tf.minimum)


def decay_rate(step):
  """numerics.adafactor_decay_rate of the global step (any integer or tensor)."""
  return adafactor_decay_rate(tf.cast(step, tf.float32))


class Adafactor:
  """mtf.optimize.AdafactorOptimizer() with its defaults, written out in TF.

  The defaults, the factoring and the schedules are tf_tput.numerics' (ADAFACTOR_*,
  factored_dims, adafactor_learning_rate, adafactor_decay_rate); beta1 0 (no momentum
  slot). apply_grad follows AdafactorOptimizer.apply_grad operation by operation, with
  mtf's lowering of its arithmetic: reduce_mean is a sum times a Python float, a
  division by a tensor is a multiplication by its reciprocal, assign_sub (not assign)
  updates the variable. With bfloat16 activations the parameter scale reads the
  bfloat16-rounded value (mtf's var.value is the activation-dtype cast).

  Not tf.keras.optimizers.Adafactor: Keras 3's (keras/src/optimizers/adafactor.py)
  factors every variable of rank >= 2 over its last two axes (mtf only when the two
  largest are both >= 128, over those: the tiny models factor nothing), defaults to
  learning rate 0.001 (mtf 0.01) and has no min_dim_size_to_factor; its updates are a
  different algorithm for these shapes, not a rounding difference.
  """

  def __init__(self, activation_dtype: str = "float32"):
    self._activation_dtype = tf.as_dtype(activation_dtype)

  @staticmethod
  def slot_shapes(shape: tuple) -> dict:
    """The slots of a variable of this shape: {"vr", "vc"} factored, else {"v"}."""
    dims = factored_dims(shape)
    if dims is None:
      return {"v": tuple(shape)}
    d0, d1 = dims
    return {"vr": tuple(s for a, s in enumerate(shape) if a != d0),
            "vc": tuple(s for a, s in enumerate(shape) if a != d1)}

  def apply_grad(self, var, grad, slots: dict, step) -> None:
    """AdafactorOptimizer.apply_grad: updates var (and its slots) in place."""
    grad = tf.cast(grad, tf.float32)
    decay = decay_rate(step)
    grad_squared = tf.square(grad) + ADAFACTOR_EPSILON1
    old_val = tf.cast(tf.cast(var, self._activation_dtype), tf.float32)
    update_scale = tf.maximum(_reduce_rms(old_val), ADAFACTOR_EPSILON2) * learning_rate(step)
    mixing_rate = 1.0 - decay
    dims = factored_dims(tuple(var.shape))
    if dims:
      d0, d1 = dims
      vr, vc = slots["vr"], slots["vc"]
      # reduce_mean(output_shape=vr_shape) drops d0; vc's drops d1.
      row_mean = tf.reduce_sum(grad_squared, axis=d0) * (1.0 / var.shape[d0])
      col_mean = tf.reduce_sum(grad_squared, axis=d1) * (1.0 / var.shape[d1])
      new_vr = vr * decay + row_mean * mixing_rate
      new_vc = vc * decay + col_mean * mixing_rate
      vr.assign(new_vr)
      vc.assign(new_vc)
      # long_term_mean = reduce_mean(new_vr, reduced_dim=d1): d1's axis within vr.
      d1_in_vr = d1 - (1 if d0 < d1 else 0)
      long_term_mean = tf.reduce_sum(new_vr, axis=d1_in_vr, keepdims=True) * (
          1.0 / var.shape[d1])
      r_factor = tf.math.rsqrt(new_vr * tf.math.reciprocal(long_term_mean))
      c_factor = tf.math.rsqrt(new_vc)
      x = grad * tf.expand_dims(r_factor, d0) * tf.expand_dims(c_factor, d1)
    else:
      v = slots["v"]
      new_v = v * decay + grad_squared * mixing_rate
      v.assign(new_v)
      x = grad * tf.math.rsqrt(new_v)
    clipping_denom = tf.maximum(1.0, _reduce_rms(x) * (1.0 / ADAFACTOR_CLIPPING_THRESHOLD))
    x = x * tf.math.reciprocal(clipping_denom)
    var.assign_sub(x * update_scale)
