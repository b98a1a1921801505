"""The JAX twin of the model tf_tput/systems/tensorflow/mtf/model.py builds with mesh_tensorflow.transformer.

Pure functions over a flat dict of float32 arrays named and shaped exactly as
tf_tput.models.variables (mtf's variable names), so that weights exported from the mtf
trainer load as they are and the same weights and batch give the same loss:

* T5 v1.0 Bitransformer (arch "encoder_decoder") and a causal Unitransformer LM
  (arch "decoder"), with mtf's layer stack (defaults.gin): pre-norm RMS norm, ReLU FFN,
  one relative attention bias per stack, embedding shared with the softmax;
* mtf's AdafactorOptimizer defaults as an optax transformation.

With ModelConfig.scan_layers each stack's blocks run under jax.lax.scan; the weights
keep their per-layer names (they are stacked inside the loss, not stored stacked).

Each function names the mtf function it mirrors (mesh_tensorflow/transformer/*.py,
layers.py, ops.py, optimize.py are the specification). Numerics follow mtf too: the
order of multiplications where it matters, what is computed in which dtype with
bfloat16 activations, and mtf's own softmax / logsumexp formulas.
"""

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tf_tput import models
from tf_tput.config import ModelConfig
from tf_tput.numerics import (
    ADAFACTOR_CLIPPING_THRESHOLD, ADAFACTOR_DECAY_EXPONENT, ADAFACTOR_EPSILON1, MASK_BIAS,
    RMS_NORM_EPSILON, Z_LOSS, adafactor_learning_rate, initializer,
    relative_position_bucket, sequence_id_of)

Constrain = Callable[[jax.Array, tuple], jax.Array]


def _no_constraint(x, dim_names):
  del dim_names
  return x


# --------------------------------------------------------------------------------------
# Parameters.

def init_params(m: ModelConfig, seed: int) -> dict:
  """Fresh float32 parameters, {mtf variable name: array}, initialized as mtf does."""
  variables = models.variables(m)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(variables))
  params = {}
  for key, v in zip(keys, variables, strict=True):
    shape = tuple(size for _, size in v.dims)
    kind, scale = initializer(v.name, shape, m)
    if kind == "ones":
      value = jnp.ones(shape, jnp.float32)
    elif kind == "normal":
      value = scale * jax.random.normal(key, shape, jnp.float32)
    elif kind == "truncated_normal":
      value = scale * jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    else:
      value = jax.random.uniform(key, shape, jnp.float32, -scale, scale)
    params[v.name] = value
  return params


# --------------------------------------------------------------------------------------
# Building blocks.

def _logsumexp(x):
  """mtf.reduce_logsumexp over the last axis (keeps it): log(sum(exp(x - max))) + max."""
  max_x = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
  return jnp.log(jnp.sum(jnp.exp(x - max_x), axis=-1, keepdims=True)) + max_x


def _softmax(x):
  """mtf.softmax: exp(x - logsumexp(x)), not exp(x - max) / sum."""
  return jnp.exp(x - _logsumexp(x))


def _rms_norm(x, scale):
  """transformer.sublayer_rms_norm: x * rsqrt(mean(x^2) + eps) * scale.

  mtf.reduce_mean is reduce_sum times the Python float 1/n, kept here.
  """
  variance = jnp.sum(jnp.square(x), axis=-1, keepdims=True) * (1.0 / x.shape[-1])
  return x * jax.lax.rsqrt(variance + RMS_NORM_EPSILON) * scale


def _mask_bias(visible, dtype):
  """attention.visibility_mask_to_attention_bias: cast(not visible) * -1e9."""
  return jnp.logical_not(visible).astype(dtype) * MASK_BIAS


def _attention(p, prefix, x, memory, bias, m, constrain):
  """transformer_layers.SelfAttention / enc_dec_attention with attention.attention.

  combine_dims: the variables' "heads" dimension (num_heads * d_kv) is split into
  [heads, d_kv] with heads major (mtf.replace_dimensions is a row-major reshape).
  Logits and softmax are float32 whatever the activation dtype (float32_logits=True);
  the weights are cast back to the values' dtype. No 1/sqrt(d_kv) at runtime.
  """
  batch, length, _ = x.shape
  memory_length = memory.shape[1]
  heads, d_kv = m.num_heads, m.d_kv
  q = (x @ p[f"{prefix}/q"]).reshape(batch, length, heads, d_kv)
  k = (memory @ p[f"{prefix}/k"]).reshape(batch, memory_length, heads, d_kv)
  v = (memory @ p[f"{prefix}/v"]).reshape(batch, memory_length, heads, d_kv)
  q = constrain(q, ("batch", "length", "heads", "d_kv"))
  k = constrain(k, ("batch", "memory_length", "heads", "d_kv"))
  v = constrain(v, ("batch", "memory_length", "heads", "d_kv"))
  logits = jnp.einsum("blhk,bmhk->bhlm", q.astype(jnp.float32), k.astype(jnp.float32))
  logits = logits + bias.astype(jnp.float32)
  logits = constrain(logits, ("batch", "heads", "length", "memory_length"))
  weights = _softmax(logits).astype(v.dtype)
  o = jnp.einsum("bhlm,bmhk->blhk", weights, v).reshape(batch, length, heads * d_kv)
  return o @ p[f"{prefix}/o"]


def _dense_relu_dense(p, prefix, x, constrain):
  """transformer_layers.DenseReluDense: relu(x @ wi) @ wo, no biases."""
  h = jax.nn.relu(x @ p[f"{prefix}/wi/kernel"])
  h = constrain(h, ("batch", "length", "d_ff"))
  return h @ p[f"{prefix}/wo/kernel"]


def _self_attention_bias(p, stack, sequence_id, causal, m, dtype):
  """SelfAttention.compute_bias: [batch, heads, length, memory_length], in dtype.

  mtf adds, in this order: the causal mask (read_priority >= write_priority, i.e.
  memory position <= query position), the sequence-id mask (equal ids; padding id 0
  sees padding), and the relative bias "bias_shared": one [heads, buckets] variable
  per stack, created in block_000's SelfAttention and reused by every layer.
  """
  length = sequence_id.shape[1]
  position = np.arange(length, dtype=np.int32)
  relative_position = position[None, :] - position[:, None]   # memory - query
  bias = 0
  if causal:
    bias = bias + _mask_bias(jnp.asarray(relative_position <= 0), dtype)[None, None]
  same_sequence = sequence_id[:, :, None] == sequence_id[:, None, :]
  bias = bias + _mask_bias(same_sequence, dtype)[:, None]
  buckets = relative_position_bucket(
      relative_position, bidirectional=not causal,
      num_buckets=m.relative_attention_num_buckets)
  values = p[models.relative_bias_name(stack)]
  if m.embedding == "one_hot":  # mtf.gather: one_hot(buckets) @ values, per layer in mtf
    one_hot = jax.nn.one_hot(buckets, values.shape[1], dtype=values.dtype)
    return bias + jnp.einsum("lmb,hb->hlm", one_hot, values)[None]
  return bias + values[:, buckets][None]


def _block(w, x, kinds, nonpadding, self_bias, encoder_output, enc_dec_bias, m,
           constrain):
  """One block of transformer.LayerStack.call: per layer, rms_norm, mask padding
  (sublayer_call_layer masks the layer's input), the layer, residual. w: the block's
  weights by their name inside block_NNN ("layer_000/SelfAttention/q")."""
  for index, kind in enumerate(kinds):
    prefix = models.layer_name(index)
    h = _rms_norm(x, w[f"{prefix}/rms_norm/scale"]) * nonpadding
    if kind == "SelfAttention":
      h = _attention(w, f"{prefix}/{kind}", h, h, self_bias, m, constrain)
    elif kind == "EncDecAttention":
      h = _attention(w, f"{prefix}/{kind}", h, encoder_output, enc_dec_bias, m, constrain)
    else:
      h = _dense_relu_dense(w, f"{prefix}/{kind}", h, constrain)
    x = x + h
  return x


def _stacked_blocks(p, stack, m, constrain):
  """Each per-block weight of a stack as one array over the blocks, [num_layers, ...],
  by its name inside block_NNN. The shared relative bias (block_000's only) is left
  out: _self_attention_bias reads it once for the stack. Each stacked weight keeps its
  variable's layout sharding, the new layer axis unsharded."""
  first = f"{models.block_name(stack, 0)}/"
  shared_bias = models.relative_bias_name(stack)
  dims = {v.name: [n for n, _ in v.dims] for v in models.variables(m)}
  return {name[len(first):]: constrain(
      jnp.stack([p[f"{models.block_name(stack, b)}/{name[len(first):]}"]
                 for b in range(m.num_layers)]), ("layers", *dims[name]))
          for name in p if name.startswith(first) and name != shared_bias}


def _stack(p, stack, x, sequence_id, m, constrain, causal,
           encoder_output=None, encoder_sequence_id=None):
  """transformer.LayerStack.call with defaults.gin's sublayers (dropout rate 0):
  num_layers blocks (_block), then the final rms_norm and sublayer_mask_padding.

  With ModelConfig.scan_layers the blocks run under one lax.scan over the stacked
  weights (_stacked_blocks): the same operations in the same order per block, and
  XLA compiles one block instead of num_layers.
  """
  dtype = x.dtype
  nonpadding = (sequence_id != 0).astype(dtype)[:, :, None]
  self_bias = _self_attention_bias(p, stack, sequence_id, causal, m, dtype)
  enc_dec_bias = None
  if encoder_output is not None:   # transformer_layers.enc_dec_attention_bias
    enc_dec_bias = _mask_bias(
        sequence_id[:, :, None] == encoder_sequence_id[:, None, :], dtype)[:, None]
  kinds = models.sublayers(with_enc_dec_attention=encoder_output is not None)
  block = functools.partial(
      _block, kinds=kinds, nonpadding=nonpadding, self_bias=self_bias,
      encoder_output=encoder_output, enc_dec_bias=enc_dec_bias, m=m, constrain=constrain)
  if m.scan_layers:
    x, _ = jax.lax.scan(lambda x, w: (block(w, x), None), x,
                        _stacked_blocks(p, stack, m, constrain))
  else:
    for b in range(m.num_layers):
      prefix = f"{models.block_name(stack, b)}/"
      block_weights = {name[len(prefix):]: value for name, value in p.items()
                       if name.startswith(prefix)}
      x = block(block_weights, x)
  return _rms_norm(x, p[f"{stack}/rms_norm/scale"]) * nonpadding


def _shift_right(x):
  return jnp.pad(x[:, :-1], ((0, 0), (1, 0)))


def autoregressive_inputs(targets, sequence_id):
  """transformer.autoregressive_inputs: targets shifted right, 0 where a sequence starts."""
  inputs = jnp.abs(_shift_right(targets))
  return inputs * (sequence_id == _shift_right(sequence_id)).astype(inputs.dtype)


def _embed(embedding, ids, constrain, method: str):
  """VocabEmbedding.ids_to_embedding.

  one_hot is mtf.gather's arithmetic (mesh_tensorflow/ops.py gather): a one-hot
  [batch, length, vocab] in the activation dtype, sharded like the vocabulary, times
  the embedding: 2 * vocab * d_model FLOPs per token forward and again for the
  embedding's gradient (a dense matmul, where a lookup's is a scatter-add). gather is
  a row lookup: the same values, almost no arithmetic.
  """
  if method == "one_hot":
    one_hot = jax.nn.one_hot(ids, embedding.shape[0], dtype=embedding.dtype)
    one_hot = constrain(one_hot, ("batch", "length", "vocab"))
    x = jnp.einsum("blv,vd->bld", one_hot, embedding)
  else:
    x = jnp.take(embedding, ids, axis=0)
  return constrain(x, ("batch", "length", "d_model"))


def _loss(embedding, x, targets, constrain):
  """VocabEmbedding.hidden_to_logits + Unitransformer._compute_loss.

  Logits over the padded vocabulary; layers.softmax_cross_entropy_with_logits against
  a one-hot in the activation dtype, plus z_loss * log_z^2; weighted by targets > 0,
  summed, times 1 / (batch * length) (Unitransformer.loss_denominator), all in the
  activation dtype as mtf computes it.
  """
  dtype = x.dtype
  x = x * (x.shape[-1] ** -0.5)
  logits = constrain(jnp.einsum("bld,vd->blv", x, embedding), ("batch", "length", "vocab"))
  log_z = _logsumexp(logits)
  soft_targets = jax.nn.one_hot(targets, logits.shape[-1], dtype=dtype)
  loss = -jnp.sum((logits - log_z) * soft_targets, axis=-1)
  loss = loss + jnp.square(log_z[..., 0]) * Z_LOSS
  weights = (targets > 0).astype(dtype)
  return jnp.sum(loss * weights) * (1.0 / targets.size)


def _sequence_id(batch, key, ids):
  return jnp.asarray(sequence_id_of(batch, key, ids, jnp.minimum), jnp.int32)


def loss_fn(params: dict, batch: dict, m: ModelConfig,
            constrain: Optional[Constrain] = None) -> jax.Array:
  """The training loss mtf's call_simple(..., compute_loss=True, mode="train") returns.

  batch: int32 "targets" [B, Lt] (and "inputs" [B, Li] for encoder_decoder), with
  optional "{inputs,targets}_segmentation" for packed rows. "_position" is not read:
  without positional embeddings mtf drops positions and uses indices, which give the
  same relative positions within a packed segment. Variables are cast once to the
  activation dtype, as mtf's Variable lowering does; the result is float32.
  """
  constrain = constrain or _no_constraint
  dtype = jnp.dtype(m.activation_dtype)
  p = {name: value.astype(dtype) for name, value in params.items()}
  targets = jnp.asarray(batch["targets"], jnp.int32)
  targets_sequence_id = _sequence_id(batch, "targets", targets)
  decoder_inputs = autoregressive_inputs(targets, targets_sequence_id)
  if m.arch == "decoder":  # a causal Unitransformer named "decoder" (systems/tensorflow/mtf/model.py)
    embedding = p["decoder/embedding"]
    x = _stack(p, "decoder", _embed(embedding, decoder_inputs, constrain, m.embedding),
               targets_sequence_id, m, constrain, causal=True)
    return _loss(embedding, x, targets, constrain).astype(jnp.float32)
  # transformer.Bitransformer.call_simple: encoder, then the decoder attending to it.
  embedding = p["shared/embedding"]
  inputs = jnp.asarray(batch["inputs"], jnp.int32)
  inputs_sequence_id = _sequence_id(batch, "inputs", inputs)
  encoder_output = _stack(p, "encoder", _embed(embedding, inputs, constrain, m.embedding),
                          inputs_sequence_id, m, constrain, causal=False)
  x = _stack(p, "decoder", _embed(embedding, decoder_inputs, constrain, m.embedding),
             targets_sequence_id, m, constrain, causal=True,
             encoder_output=encoder_output, encoder_sequence_id=inputs_sequence_id)
  return _loss(embedding, x, targets, constrain).astype(jnp.float32)


# --------------------------------------------------------------------------------------
# Optimizer.

def _learning_rate(count):
  """numerics.adafactor_learning_rate. optax counts updates from 0; mtf's trainer
  increments its global step after the update, so update k reads step k in both."""
  return adafactor_learning_rate(jnp.asarray(count, jnp.float32), jax.lax.rsqrt,
                                 jnp.minimum)


def adafactor() -> optax.GradientTransformation:
  """mtf.optimize.AdafactorOptimizer() with its defaults, as optax.adafactor.

  optax.adafactor is the same algorithm, checked against optimize.py line by line:
  v = decay * v + (1 - decay) * (g^2 + 1e-30) with decay = 1 - (step + 1)^-0.8;
  factored (row / column means, the row factor normalized by its mean) when the two
  largest dimensions are both >= 128; update g * rsqrt(v) clipped to RMS 1; times
  the learning rate and max(rms(param), 1e-3); beta1 = 0 (no momentum). The
  constants are tf_tput.numerics' ADAFACTOR_*, but for the 1e-3: optax's own
  scale_by_param_block_rms default, which adafactor() does not take.
  Differences are floating-point rounding only (mtf divides by multiplying with a
  reciprocal and multiplies lr into the parameter scale first); with bfloat16
  activations mtf also takes the parameter scale of the bfloat16-rounded value.
  """
  return optax.adafactor(
      learning_rate=_learning_rate,
      min_dim_size_to_factor=models.ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR,
      decay_rate=ADAFACTOR_DECAY_EXPONENT, decay_offset=0,
      multiply_by_parameter_scale=True, clipping_threshold=ADAFACTOR_CLIPPING_THRESHOLD,
      momentum=None, eps=ADAFACTOR_EPSILON1, factored=True)
