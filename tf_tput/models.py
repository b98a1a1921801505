"""Framework-neutral model arithmetic: variables, parameter count, FLOPs, bytes per device.

One place for these formulas: `tf_tput.plan` prints them, `tf_tput.measure.metrics` uses them
for MFU, and tests pin them against the variables mesh_tensorflow actually creates.
Variable shapes follow mesh_tensorflow.transformer (mtf dimension names, attention
projections with heads and d_kv combined into one "heads" dimension).

`m` is always a config.ModelConfig, read by its fields: config validates layouts
with this arithmetic, so imports go config -> pipeline -> models and never back, not
even for annotations (tests/unit/test_imports.py).
"""

import dataclasses
import math

# mtf's Unitransformer pads the vocabulary to a multiple of this (vocab_divisor).
VOCAB_DIVISOR = 128
# mtf's AdafactorOptimizer factors a second moment only when its two largest
# dimensions are both at least this size (min_dim_size_to_factor).
ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR = 128
BYTES_PER_VARIABLE_ELEMENT = 4   # variables and optimizer slots are float32 in every dtype


def activation_bytes_per_element(activation_dtype: str) -> int:
  """ModelConfig.activation_dtype's element size: bfloat16 2, float32 4."""
  return 2 if activation_dtype == "bfloat16" else 4


@dataclasses.dataclass(frozen=True)
class Variable:
  name: str
  dims: tuple  # ((mtf dimension name, size), ...)

  @property
  def size(self) -> int:
    return math.prod(size for _, size in self.dims)


def padded_vocab(vocab_size: int) -> int:
  return -(-vocab_size // VOCAB_DIVISOR) * VOCAB_DIVISOR


def _attention(prefix: str, m, relative_bias: bool) -> list:
  d, inner = ("d_model", m.d_model), ("heads", m.num_heads * m.d_kv)
  out = [Variable(f"{prefix}/{w}", (d, inner)) for w in "qkv"]
  out.append(Variable(f"{prefix}/o", (inner, d)))
  if relative_bias:  # "bias_shared": one per stack, created by its first layer
    out.append(Variable(f"{prefix}/relative_attention_bias",
                        (("heads", m.num_heads), ("buckets", m.relative_attention_num_buckets))))
  return out


def sublayers(with_enc_dec_attention: bool) -> list:
  """The layers of one block, in order (defaults.gin's layer stack): every system's
  model runs them so, and their variables are named after them."""
  return (["SelfAttention"] + (["EncDecAttention"] if with_enc_dec_attention else [])
          + ["DenseReluDense"])


def block_name(stack: str, block: int) -> str:
  """A block's variable-name prefix, as mtf names it: "encoder/block_003"."""
  return f"{stack}/block_{block:03d}"


def layer_name(index: int) -> str:
  """A layer's name inside its block, as mtf names it: "layer_001"."""
  return f"layer_{index:03d}"


def relative_bias_name(stack: str) -> str:
  """The stack's one relative attention bias ("bias_shared"): created by its first
  block's SelfAttention, read by every layer."""
  return f"{block_name(stack, 0)}/{layer_name(0)}/SelfAttention/relative_attention_bias"


def _stack(stack: str, m, with_enc_dec_attention: bool) -> list:
  d = ("d_model", m.d_model)
  out = []
  for block in range(m.num_layers):
    for index, kind in enumerate(sublayers(with_enc_dec_attention)):
      prefix = f"{block_name(stack, block)}/{layer_name(index)}"
      out.append(Variable(f"{prefix}/rms_norm/scale", (d,)))
      if kind == "DenseReluDense":
        out.append(Variable(f"{prefix}/{kind}/wi/kernel", (d, ("d_ff", m.d_ff))))
        out.append(Variable(f"{prefix}/{kind}/wo/kernel", (("d_ff", m.d_ff), d)))
      else:
        first_self_attention = kind == "SelfAttention" and block == 0
        out.extend(_attention(f"{prefix}/{kind}", m, relative_bias=first_self_attention))
  out.append(Variable(f"{stack}/rms_norm/scale", (d,)))
  return out


def variables(m) -> list:
  """The trainable variables mesh_tensorflow.transformer creates for this model.

  T5 v1.0: one embedding shared by encoder, decoder and softmax. Decoder-only: the
  same layers without encoder-decoder attention, embedding shared with the softmax.
  """
  embedding_dims = (("vocab", padded_vocab(m.vocab_size)), ("d_model", m.d_model))
  if m.arch == "encoder_decoder":
    return ([Variable("shared/embedding", embedding_dims)]
            + _stack("encoder", m, with_enc_dec_attention=False)
            + _stack("decoder", m, with_enc_dec_attention=True))
  return [Variable("decoder/embedding", embedding_dims)] + _stack("decoder", m, False)


# Dimension names of the main activations, as mtf names them (the JAX twin uses the
# same names for its sharding constraints). "memory_length" is the attended length.
ACTIVATION_DIMS = (
    ("batch", "length", "d_model"),
    ("batch", "length", "d_ff"),
    ("batch", "length", "heads", "d_kv"),
    ("batch", "memory_length", "heads", "d_kv"),
    ("batch", "heads", "length", "memory_length"),
    ("batch", "length", "vocab"),
)


def tensor_dim_names(m) -> list:
  """Every combination of dimension names that occurs in one tensor, in a fixed order."""
  combos = [tuple(name for name, _ in v.dims) for v in variables(m)] + list(ACTIVATION_DIMS)
  return list(dict.fromkeys(combos))


def num_params(m) -> int:
  return sum(v.size for v in variables(m))


def tokens_per_example(m, inputs_length: int, targets_length: int) -> int:
  """Positions fed to the model: encoder inputs + decoder targets, or targets alone."""
  return targets_length + (inputs_length if m.arch == "encoder_decoder" else 0)


def forward_matmul_flops(m, inputs_length: int, targets_length: int) -> int:
  """Forward matmul FLOPs of one example (2 per multiply-add).

  Counted: every dense projection, attention scores and attention-weighted values in
  full (causal masks not halved, as in PaLM's MFU), the output logits over the padded
  vocabulary. Not counted: embedding lookups, norms, softmax, elementwise ops.
  """
  d, inner, d_ff = m.d_model, m.num_heads * m.d_kv, m.d_ff

  def self_attention_layer(length):  # q, k, v, o projections + scores + values
    return length * 2 * 4 * d * inner + 2 * 2 * length * length * inner

  def ffn_layer(length):
    return length * 2 * 2 * d * d_ff

  lt = targets_length
  decoder = m.num_layers * (self_attention_layer(lt) + ffn_layer(lt))
  logits = lt * 2 * d * padded_vocab(m.vocab_size)
  if m.arch == "decoder":
    return decoder + logits
  li = inputs_length
  encoder = m.num_layers * (self_attention_layer(li) + ffn_layer(li))
  # Encoder-decoder attention: q, o on decoder positions; k, v on encoder outputs.
  enc_dec = m.num_layers * (lt * 2 * 2 * d * inner + li * 2 * 2 * d * inner
                            + 2 * 2 * lt * li * inner)
  return encoder + decoder + enc_dec + logits


def model_flops_per_token(m, inputs_length: int, targets_length: int) -> float:
  """Training FLOPs per position: 3 x forward (forward + two backward matmuls)."""
  return (3 * forward_matmul_flops(m, inputs_length, targets_length)
          / tokens_per_example(m, inputs_length, targets_length))


def sharded_size(dims, mesh_shape: dict, layout: dict) -> int:
  size = 1
  for name, dim_size in dims:
    axis = layout.get(name)
    size *= dim_size // mesh_shape[axis] if axis in mesh_shape else dim_size
  return size


def adafactor_slot_dims(v: Variable) -> list:
  """Shapes of mtf AdafactorOptimizer's slots (defaults: factored, beta1 = 0)."""
  dims = list(v.dims)
  by_size = sorted(dims, key=lambda dim: -dim[1])
  if len(dims) < 2 or by_size[1][1] < ADAFACTOR_MIN_DIM_SIZE_TO_FACTOR:
    return [tuple(dims)]  # full second moment "v"
  d0, d1 = by_size[:2]
  return [tuple(x for x in dims if x != d0), tuple(x for x in dims if x != d1)]


def bytes_per_device(m, mesh_shape: dict, layout: dict) -> dict:
  """Training state on each device: sharded parameters and Adafactor slots.

  Activations and framework copies (PlacementMeshImpl's unsharded master variables)
  are not included; this is the state a SIMD (TPU) lowering keeps per device.
  """
  params = optimizer = 0
  for v in variables(m):
    params += sharded_size(v.dims, mesh_shape, layout)
    optimizer += sum(sharded_size(s, mesh_shape, layout) for s in adafactor_slot_dims(v))
  params *= BYTES_PER_VARIABLE_ELEMENT
  optimizer *= BYTES_PER_VARIABLE_ELEMENT
  return {"params": params, "optimizer": optimizer, "total": params + optimizer}
