"""The PyTorch twin of the model tf_tput/systems/tensorflow/mtf/model.py builds with mesh_tensorflow.

A function-by-function port of tf_tput/systems/jax/model.py (which is checked against
mesh_tensorflow.transformer itself) to plain torch ops: functions over a flat dict of
tensors named and shaped exactly as tf_tput.models.variables (mtf's variable names),
so that weights exported from the mtf trainer load as they are and give its loss:

* T5 v1.0 Bitransformer (arch "encoder_decoder") and a causal Unitransformer LM
  (arch "decoder"): pre-norm RMS norm, ReLU FFN, one relative attention bias per
  stack, embedding shared with the softmax (scaled by d_model**-0.5);
* mtf's AdafactorOptimizer with its defaults, written out here (Adafactor below).

Each function names the mtf function it mirrors (mesh_tensorflow/transformer/*.py,
layers.py, ops.py, optimize.py are the specification); where jax/model.py notes that the
order of operations or the dtype matters, the same order and dtype are kept. No
torch.nn modules: trainer.py holds the parameters and runs these functions.
"""

import functools
from typing import Optional

import numpy as np
import torch

from tf_tput import models
from tf_tput.config import ModelConfig
from tf_tput.systems.torch import gemm
from tf_tput.numerics import (
    ADAFACTOR_CLIPPING_THRESHOLD, ADAFACTOR_EPSILON1, ADAFACTOR_EPSILON2, MASK_BIAS,
    RMS_NORM_EPSILON, Z_LOSS, adafactor_decay_rate, adafactor_learning_rate,
    factored_dims, initializer, relative_position_bucket, sequence_id_of)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# --------------------------------------------------------------------------------------
# Parameters.

def init_params(m: ModelConfig, seed: int, device="cpu") -> dict:
  """Fresh float32 values, {mtf variable name: tensor}, initialized as mtf does (the
  same distributions; not mtf's random numbers). Drawn on the CPU from one seeded
  generator per variable, so every process and device gets the same values."""
  params = {}
  for index, v in enumerate(models.variables(m)):
    shape = tuple(size for _, size in v.dims)
    kind, scale = initializer(v.name, shape, m)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
    if kind == "ones":
      value = torch.ones(shape)
    elif kind == "normal":
      value = scale * torch.randn(shape, generator=generator)
    elif kind == "truncated_normal":
      value = scale * torch.nn.init.trunc_normal_(torch.empty(shape), 0.0, 1.0, -2.0, 2.0,
                                                  generator=generator)
    else:
      value = torch.empty(shape).uniform_(-scale, scale, generator=generator)
    params[v.name] = value.to(device)
  return params


# --------------------------------------------------------------------------------------
# Building blocks.

def _logsumexp(x):
  """mtf.reduce_logsumexp over the last axis (keeps it): log(sum(exp(x - max))) + max."""
  max_x = torch.amax(x, dim=-1, keepdim=True).detach()
  return torch.log(torch.sum(torch.exp(x - max_x), dim=-1, keepdim=True)) + max_x


def _softmax(x):
  """mtf.softmax: exp(x - logsumexp(x)), not exp(x - max) / sum."""
  return torch.exp(x - _logsumexp(x))


def _rms_norm(x, scale):
  """transformer.sublayer_rms_norm: x * rsqrt(mean(x^2) + eps) * scale; the mean is
  reduce_sum times the Python float 1/n, as mtf.reduce_mean computes it."""
  variance = torch.sum(torch.square(x), dim=-1, keepdim=True) * (1.0 / x.shape[-1])
  return x * torch.rsqrt(variance + RMS_NORM_EPSILON) * scale


def _mask_bias(visible, dtype):
  """attention.visibility_mask_to_attention_bias: cast(not visible) * -1e9."""
  return torch.logical_not(visible).to(dtype) * MASK_BIAS


def _one_hot(ids, depth: int, dtype):
  """mtf.one_hot in `dtype`: 1 at each id, 0 elsewhere (written in place, not through
  torch's int64 one_hot and a cast)."""
  out = torch.zeros(*ids.shape, depth, dtype=dtype, device=ids.device)
  return out.scatter_(-1, ids.unsqueeze(-1).long(), 1.0)


def _attention(p, prefix, x, memory, bias, m):
  """transformer_layers.SelfAttention / enc_dec_attention with attention.attention.

  The "heads" dimension (num_heads * d_kv) splits into [heads, d_kv], heads major.
  Logits and softmax in float32 (float32_logits=True), the weights cast back to the
  values' dtype; no 1/sqrt(d_kv) at runtime (it is in q's initializer).
  """
  batch, length, _ = x.shape
  memory_length = memory.shape[1]
  heads, d_kv = m.num_heads, m.d_kv
  q = gemm.matmul(x, p[f"{prefix}/q"]).reshape(batch, length, heads, d_kv)
  k = gemm.matmul(memory, p[f"{prefix}/k"]).reshape(batch, memory_length, heads, d_kv)
  v = gemm.matmul(memory, p[f"{prefix}/v"]).reshape(batch, memory_length, heads, d_kv)
  logits = torch.einsum("blhk,bmhk->bhlm", q.float(), k.float())
  logits = logits + bias.float()
  weights = _softmax(logits).to(v.dtype)
  o = torch.einsum("bhlm,bmhk->blhk", weights, v).reshape(batch, length, heads * d_kv)
  return gemm.matmul(o, p[f"{prefix}/o"])


def _dense_relu_dense(p, prefix, x):
  """transformer_layers.DenseReluDense: relu(x @ wi) @ wo, no biases."""
  return gemm.matmul(torch.relu(gemm.matmul(x, p[f"{prefix}/wi/kernel"])),
                     p[f"{prefix}/wo/kernel"])


@functools.lru_cache(maxsize=None)
def _relative_positions_cached(length: int, causal: bool, num_buckets: int) -> tuple:
  position = np.arange(length, dtype=np.int32)
  relative_position = position[None, :] - position[:, None]
  buckets = relative_position_bucket(relative_position, bidirectional=not causal,
                                     num_buckets=num_buckets)
  return torch.from_numpy(relative_position), torch.from_numpy(buckets)


def _relative_positions(length: int, causal: bool, num_buckets: int) -> tuple:
  """(relative position memory - query, its bucket), int32 CPU tensors [length,
  length]: they depend only on the length, so they are computed once, in numpy
  (tf_tput/numerics.py). Under torch.compile they are constants of the graph
  (mark_compile_constants)."""
  return _relative_positions_cached(length, causal, num_buckets)


def mark_compile_constants():
  """Before torch.compile: dynamo calls _relative_positions eagerly rather than
  tracing numpy's float32 log through torch's. Not a decorator: marking imports
  torch._dynamo, 0.9 s of every torch process here, and only compiled runs need it."""
  torch.compiler.assume_constant_result(_relative_positions)  # marks it in place


def _self_attention_bias(p, stack, sequence_id, causal, m, dtype):
  """SelfAttention.compute_bias: [batch, heads, length, memory_length], in dtype.

  In mtf's order: the causal mask (memory position <= query position), the
  sequence-id mask (equal ids; padding id 0 sees padding), the relative bias
  "bias_shared" (one [heads, buckets] variable per stack, block_000's, every layer).
  """
  device = sequence_id.device
  relative_position, buckets = _relative_positions(
      sequence_id.shape[1], causal, m.relative_attention_num_buckets)
  bias = torch.zeros((), dtype=dtype, device=device)
  if causal:
    bias = bias + _mask_bias((relative_position <= 0).to(device), dtype)[None, None]
  same_sequence = sequence_id[:, :, None] == sequence_id[:, None, :]
  bias = bias + _mask_bias(same_sequence, dtype)[:, None]
  buckets = buckets.to(device)
  values = p[models.relative_bias_name(stack)]
  if m.embedding == "one_hot":  # mtf.gather: one_hot(buckets) @ values
    one_hot = _one_hot(buckets, values.shape[1], values.dtype)
    return bias + torch.einsum("lmb,hb->hlm", one_hot, values)[None]
  return bias + values[:, buckets][None]


def _stack(p, stack, x, sequence_id, m, causal, encoder_output=None,
           encoder_sequence_id=None):
  """transformer.LayerStack.call with defaults.gin's sublayers (dropout rate 0):
  per layer rms_norm, mask padding, the layer, residual; then rms_norm and the mask."""
  dtype = x.dtype
  nonpadding = (sequence_id != 0).to(dtype)[:, :, None]
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
  return torch.nn.functional.pad(x[:, :-1], (1, 0))


def autoregressive_inputs(targets, sequence_id):
  """transformer.autoregressive_inputs: targets shifted right, 0 where a sequence starts."""
  inputs = torch.abs(_shift_right(targets))
  return inputs * (sequence_id == _shift_right(sequence_id)).to(inputs.dtype)


def _embed(embedding, ids, method: str):
  """VocabEmbedding.ids_to_embedding. one_hot is mtf.gather's arithmetic (a one-hot
  [batch, length, vocab] in the activation dtype times the embedding, and a dense
  matmul for its gradient); gather is a row lookup with the same values (its
  gradient a scatter-add)."""
  if method == "one_hot":
    return gemm.matmul(_one_hot(ids, embedding.shape[0], embedding.dtype), embedding)
  return torch.nn.functional.embedding(ids, embedding)


def _loss(embedding, x, targets, denominator):
  """VocabEmbedding.hidden_to_logits + Unitransformer._compute_loss.

  Logits over the padded vocabulary from x * d_model**-0.5;
  layers.softmax_cross_entropy_with_logits against a one-hot in the activation dtype,
  plus z_loss * log_z^2; weighted by targets > 0, summed, times 1 / denominator
  (Unitransformer.loss_denominator: the global batch * length), in the activation dtype.
  The one-hot's sum over the vocabulary picks one term exactly (x * 1 plus zeros), so
  it is read by index: the same values and gradients, without a [batch, length, vocab]
  product.
  """
  dtype = x.dtype
  x = x * (x.shape[-1] ** -0.5)
  logits = gemm.matmul(x, embedding.t())
  log_z = _logsumexp(logits)
  target_logits = torch.gather(logits, -1, targets.unsqueeze(-1).long())
  loss = -(target_logits - log_z)[..., 0]
  loss = loss + torch.square(log_z[..., 0]) * Z_LOSS
  weights = (targets > 0).to(dtype)
  return torch.sum(loss * weights) * (1.0 / denominator)


def _minimum(x, bound):
  """min(x, bound) for a Python number bound (torch.minimum takes tensors only)."""
  return torch.clamp(x, max=bound)


def _sequence_id(batch, key, ids):
  return sequence_id_of(batch, key, ids, _minimum).to(torch.int32)


def loss_fn(params: dict, batch: dict, m: ModelConfig,
            denominator: Optional[int] = None) -> torch.Tensor:
  """jax_model.loss_fn: the loss mtf's call_simple(compute_loss=True, mode="train")
  returns, as a float32 scalar tensor.

  batch: int32 tensors "targets" [B, Lt] (and "inputs" [B, Li] for encoder_decoder),
  optional "{inputs,targets}_segmentation", on the parameters' device. denominator:
  mtf's loss denominator, the global batch's targets.size; a replica's rows pass the
  global one, so the replicas' losses sum to the global batch's loss. Variables are
  cast once to the activation dtype, as mtf's Variable lowering does.
  """
  dtype = DTYPES[m.activation_dtype]
  p = {name: value.to(dtype) for name, value in params.items()}
  targets = batch["targets"].to(torch.int32)
  if denominator is None:
    denominator = targets.numel()
  targets_sequence_id = _sequence_id(batch, "targets", targets)
  decoder_inputs = autoregressive_inputs(targets, targets_sequence_id)
  if m.arch == "decoder":  # a causal Unitransformer named "decoder" (systems/tensorflow/mtf/model.py)
    embedding = p["decoder/embedding"]
    x = _stack(p, "decoder", _embed(embedding, decoder_inputs, m.embedding),
               targets_sequence_id, m, causal=True)
    return _loss(embedding, x, targets, denominator).float()
  # transformer.Bitransformer.call_simple: encoder, then the decoder attending to it.
  embedding = p["shared/embedding"]
  inputs = batch["inputs"].to(torch.int32)
  inputs_sequence_id = _sequence_id(batch, "inputs", inputs)
  encoder_output = _stack(p, "encoder", _embed(embedding, inputs, m.embedding),
                          inputs_sequence_id, m, causal=False)
  x = _stack(p, "decoder", _embed(embedding, decoder_inputs, m.embedding),
             targets_sequence_id, m, causal=True,
             encoder_output=encoder_output, encoder_sequence_id=inputs_sequence_id)
  return _loss(embedding, x, targets, denominator).float()


# --------------------------------------------------------------------------------------
# Optimizer.

def _reduce_rms(x):
  """optimize.reduce_rms: sqrt(mtf.reduce_mean(x^2)), the mean a sum times 1 / size."""
  return torch.sqrt(torch.sum(torch.square(x)) * (1.0 / x.numel()))


class Adafactor:
  """mtf.optimize.AdafactorOptimizer() with its defaults, written out in torch.

  The defaults, the factoring and the schedules are tf_tput.numerics' (ADAFACTOR_*,
  factored_dims, adafactor_learning_rate, adafactor_decay_rate); beta1 0 (no momentum
  slot). update() follows AdafactorOptimizer.apply_grad operation by operation, as
  tensorflow/tf2/model.py's Adafactor does, with mtf's lowering of its arithmetic:
  reduce_mean is a sum times a Python float, a division by a tensor is a
  multiplication by its reciprocal. With bfloat16 activations the parameter scale
  reads the bfloat16-rounded value (mtf's var.value is the activation-dtype cast).

  Not transformers' Adafactor: it factors every variable of rank >= 2 over its last
  two axes (mtf only when the two largest are both >= 128, over those) and computes
  its RMS and scale from other values; a different algorithm for these shapes.

  The step counter is a float32 tensor on the parameters' device, so an update
  never waits for the host and compiles to one graph whatever the step.
  """

  def __init__(self, params: dict, activation_dtype: str = "float32"):
    self._activation_dtype = DTYPES[activation_dtype]
    first = next(iter(params.values()))
    self.step = torch.zeros((), dtype=torch.float32, device=first.device)
    self.slots = {}
    for name, value in params.items():
      dims = factored_dims(tuple(value.shape))
      if dims is None:
        self.slots[name] = {"v": torch.zeros_like(value)}
      else:
        d0, d1 = dims  # vr drops d0 (the row means), vc drops d1
        self.slots[name] = {"vr": torch.zeros_like(value.sum(d0)),
                            "vc": torch.zeros_like(value.sum(d1))}

  @torch.no_grad()
  def reset(self) -> None:
    """Back to step 0 with empty slots (new parameters were loaded)."""
    self.step.zero_()
    for slots in self.slots.values():
      for slot in slots.values():
        slot.zero_()

  @torch.no_grad()
  def update(self, params: dict, grads: dict) -> None:
    """One AdafactorOptimizer.apply_grad for every variable, in place; then step += 1."""
    decay = adafactor_decay_rate(self.step)
    mixing_rate = 1.0 - decay
    lr = adafactor_learning_rate(self.step, torch.rsqrt, _minimum)
    for name, var in params.items():
      self._apply_grad(var, grads[name].float(), self.slots[name], decay, mixing_rate,
                       lr)
    self.step += 1.0

  def _apply_grad(self, var, grad, slots, decay, mixing_rate, lr) -> None:
    """AdafactorOptimizer.apply_grad; in-place arithmetic where mtf's values allow it
    (each product and sum is mtf's), so an eager step allocates few whole-variable
    temporaries."""
    grad_squared = torch.square(grad).add_(ADAFACTOR_EPSILON1)
    old_val = (var if self._activation_dtype == torch.float32
               else var.to(self._activation_dtype).float())
    update_scale = torch.clamp(_reduce_rms(old_val), min=ADAFACTOR_EPSILON2) * lr
    dims = factored_dims(tuple(var.shape))
    if dims:
      d0, d1 = dims
      vr, vc = slots["vr"], slots["vc"]
      row_mean = torch.sum(grad_squared, dim=d0) * (1.0 / var.shape[d0])
      col_mean = torch.sum(grad_squared, dim=d1) * (1.0 / var.shape[d1])
      vr.mul_(decay).add_(row_mean.mul_(mixing_rate))
      vc.mul_(decay).add_(col_mean.mul_(mixing_rate))
      # long_term_mean = reduce_mean(new_vr, reduced_dim=d1): d1's axis within vr.
      d1_in_vr = d1 - (1 if d0 < d1 else 0)
      long_term_mean = torch.sum(vr, dim=d1_in_vr, keepdim=True) * (1.0 / var.shape[d1])
      r_factor = torch.rsqrt(vr * torch.reciprocal(long_term_mean))
      c_factor = torch.rsqrt(vc)
      x = (grad * r_factor.unsqueeze(d0)).mul_(c_factor.unsqueeze(d1))
    else:
      v = slots["v"]
      v.mul_(decay).add_(grad_squared.mul_(mixing_rate))
      x = torch.rsqrt(v).mul_(grad)
    clipping_denom = torch.clamp(_reduce_rms(x) * (1.0 / ADAFACTOR_CLIPPING_THRESHOLD),
                                 min=1.0)
    var.sub_(x.mul_(torch.reciprocal(clipping_denom)).mul_(update_scale))
