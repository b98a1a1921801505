"""tf_tput/models.py: parameter counts, FLOPs, bytes per device, against hand arithmetic
(against the variables mesh_tensorflow actually creates: tests/integration/
test_mtf_tfds.py)."""

import math

import pytest

from tf_tput import config
from tf_tput import models
from tf_tput.config import ModelConfig


def _model(name: str) -> ModelConfig:
  return config.load_experiment([f"gin/models/{name}.gin"]).model


# --------------------------------------------------------------------------------------
# Parameter counts.

# Exact counts of T5 v1.0 (equal to Hugging Face's t5-small ... t5-11b parameter counts).
T5_EXACT = {
    "t5_small": 60_506_624,
    "t5_base": 222_903_552,
    "t5_large": 737_668_096,
    "t5_3b": 2_851_598_336,
    "t5_11b": 11_307_321_344,
}


@pytest.mark.parametrize("name,expected", sorted(T5_EXACT.items()))
def test_t5_param_counts_exact(name, expected):
  m = _model(name)
  assert m.name == name
  assert m.arch == "encoder_decoder"
  assert models.num_params(m) == expected


def _round_like(count: int, published: float) -> float:
  """`count` rounded to the significant figures `published` is written with.

  Trailing zeros are not significant: "60M" is one figure (nearest 10M), "220M" two
  (nearest 10M), "3B" one, "11B" two (nearest 1B).
  """
  digits = str(int(published)).rstrip("0")
  exponent = len(str(int(published))) - len(digits)
  return round(count / 10 ** exponent) * 10 ** exponent


@pytest.mark.parametrize("name,published", [
    ("t5_small", 60_000_000),        # 60,506,624 -> 60M (not 61M at the nearest 1M)
    ("t5_base", 220_000_000),        # 222,903,552 -> 220M
    ("t5_3b", 3_000_000_000),        # 2,851,598,336 -> 3B
    ("t5_11b", 11_000_000_000),      # 11,307,321,344 -> 11B
])
def test_t5_param_counts_round_to_published(name, published):
  assert _round_like(models.num_params(_model(name)), published) == published


def test_round_like_helper():
  assert _round_like(64_999_999, 60_000_000) == 60_000_000
  assert _round_like(65_000_001, 60_000_000) == 70_000_000
  assert _round_like(225_000_001, 220_000_000) == 230_000_000
  assert _round_like(11_600_000_000, 11_000_000_000) == 12_000_000_000


def test_t5_large_near_published_770m():
  # T5 paper / model cards publish Large as "770M", but T5 v1.0 Large (24+24 layers,
  # d_model 1024, d_ff 4096, 16 heads x 64, vocab 32128, shared embedding) really has
  # 737,668,096 parameters -- Hugging Face's t5-large counts the same 737.7M. The
  # published figure does not round from the true count, so only closeness is pinned.
  count = models.num_params(_model("t5_large"))
  assert count == 737_668_096
  assert abs(count - 770e6) / 770e6 < 0.05


def test_decoder_3b_near_published():
  count = models.num_params(_model("decoder_3b"))
  assert _model("decoder_3b").arch == "decoder"
  assert abs(count - 3e9) / 3e9 < 0.10
  # Published "3B": one significant figure. 3,186,616,832 rounds to 3B.
  assert _round_like(count, 3_000_000_000) == 3_000_000_000


@pytest.mark.parametrize("name,published", [("decoder_64b", 64e9),
                                            ("decoder_136b", 136e9)])
def test_large_decoders_within_2_percent(name, published):
  count = models.num_params(_model(name))
  assert abs(count - published) / published < 0.02


def test_num_params_is_sum_of_variable_sizes():
  m = _model("t5_tiny")
  vs = models.variables(m)
  assert models.num_params(m) == sum(math.prod(s for _, s in v.dims) for v in vs)
  names = [v.name for v in vs]
  assert len(names) == len(set(names))  # no variable counted twice
  # One shared embedding; one relative attention bias per stack.
  assert sum("embedding" in n for n in names) == 1
  assert sum("relative_attention_bias" in n for n in names) == 2


# --------------------------------------------------------------------------------------
# Vocabulary padding.

@pytest.mark.parametrize("vocab,padded", [(500, 512), (512, 512), (32128, 32128),
                                          (1, 128), (129, 256)])
def test_padded_vocab(vocab, padded):
  assert models.padded_vocab(vocab) == padded


# --------------------------------------------------------------------------------------
# FLOPs on hand-computed cases.

def test_forward_flops_decoder_hand_computed():
  m = ModelConfig(name="x", arch="decoder", num_layers=1, d_model=4, d_ff=8,
                  num_heads=2, d_kv=2, vocab_size=128)
  L = 3
  d, inner, d_ff, vocab = 4, 2 * 2, 8, 128   # padded_vocab(128) == 128
  qkvo = L * (2 * 4 * d * inner)             # 3 * 128 = 384
  ffn = L * (2 * 2 * d * d_ff)               # 3 * 128 = 384
  scores_values = 2 * 2 * L * L * inner      # 144
  logits = L * (2 * d * vocab)               # 3 * 1024 = 3072
  expected = qkvo + ffn + scores_values + logits
  assert (qkvo, ffn, scores_values, logits) == (384, 384, 144, 3072)
  assert expected == 3984
  assert models.forward_matmul_flops(m, inputs_length=999, targets_length=L) == 3984
  assert models.tokens_per_example(m, 999, L) == 3  # decoder-only: targets alone
  assert models.model_flops_per_token(m, 999, L) == pytest.approx(3 * 3984 / 3)


def test_forward_flops_encoder_decoder_hand_computed():
  # vocab 200 pads to 256: the logits are computed over the padded vocabulary.
  m = ModelConfig(name="x", arch="encoder_decoder", num_layers=1, d_model=4, d_ff=8,
                  num_heads=2, d_kv=2, vocab_size=200)
  Li, Lt = 5, 3
  d, inner, d_ff, vocab = 4, 4, 8, 256
  encoder = (Li * 2 * 4 * d * inner            # q,k,v,o: 5 * 128 = 640
             + 2 * 2 * Li * Li * inner         # scores + values: 400
             + Li * 2 * 2 * d * d_ff)          # ffn: 5 * 128 = 640
  decoder_self = (Lt * 2 * 4 * d * inner       # 384
                  + 2 * 2 * Lt * Lt * inner    # 144
                  + Lt * 2 * 2 * d * d_ff)     # 384
  enc_dec = (Lt * 2 * 2 * d * inner            # q, o on decoder tokens: 192
             + Li * 2 * 2 * d * inner          # k, v on encoder tokens: 320
             + 2 * 2 * Lt * Li * inner)        # scores + values: 240
  logits = Lt * 2 * d * vocab                  # 6144
  expected = encoder + decoder_self + enc_dec + logits
  assert (encoder, decoder_self, enc_dec, logits) == (1680, 912, 752, 6144)
  assert expected == 9488
  assert models.forward_matmul_flops(m, Li, Lt) == 9488
  assert models.tokens_per_example(m, Li, Lt) == 8
  assert models.model_flops_per_token(m, Li, Lt) == pytest.approx(3 * 9488 / 8)
  # Swapping the lengths changes the count (the logits are on decoder positions only).
  assert models.forward_matmul_flops(m, Lt, Li) != 9488


def test_forward_flops_scale_with_layers():
  kw = dict(name="x", arch="decoder", d_model=4, d_ff=8, num_heads=2, d_kv=2,
            vocab_size=128)
  one = models.forward_matmul_flops(ModelConfig(num_layers=1, **kw), 0, 3)
  two = models.forward_matmul_flops(ModelConfig(num_layers=2, **kw), 0, 3)
  logits = 3 * 2 * 4 * 128
  assert two - logits == 2 * (one - logits)


# --------------------------------------------------------------------------------------
# Bytes per device and Adafactor slots.

MODEL_AXIS_2 = {"model": 2}
MODEL_LAYOUT = {"d_ff": "model", "heads": "model", "vocab": "model"}


def test_bytes_per_device_tiny_hand_computed():
  m = ModelConfig(name="x", arch="decoder", num_layers=1, d_model=4, d_ff=8,
                  num_heads=2, d_kv=2, vocab_size=128)
  # Variables (sharded element counts on model:2 in parentheses):
  #   embedding [vocab 128, d_model 4]          512 (256: vocab split)
  #   rms_norm/scale [4]                        4   (4)
  #   q, k, v [d_model 4, heads 4]              3*16 = 48 (24: heads split)
  #   o [heads 4, d_model 4]                    16  (8)
  #   relative_attention_bias [heads 2, 32]     64  (32: heads split)
  #   rms_norm/scale [4]                        4   (4)
  #   wi [4, d_ff 8], wo [d_ff 8, 4]            64  (32: d_ff split)
  #   final rms_norm/scale [4]                  4   (4)
  unsharded = 512 + 4 + 48 + 16 + 64 + 4 + 64 + 4
  sharded = 256 + 4 + 24 + 8 + 32 + 4 + 32 + 4
  assert (unsharded, sharded) == (716, 364)
  assert models.num_params(m) == unsharded
  # Nothing is factored: every variable's second-largest dimension is < 128, so each
  # Adafactor slot has its variable's shape.
  got = models.bytes_per_device(m, MODEL_AXIS_2, MODEL_LAYOUT)
  assert got == {"params": 4 * sharded, "optimizer": 4 * sharded, "total": 8 * sharded}
  whole = models.bytes_per_device(m, {"batch": 1}, MODEL_LAYOUT)
  assert whole["params"] == 4 * unsharded
  assert got["params"] < whole["params"]
  # A layout rule for an axis the mesh lacks does not shard.
  assert models.bytes_per_device(m, {"batch": 2}, MODEL_LAYOUT) == whole


def test_bytes_per_device_factored_slots_hand_computed():
  m = ModelConfig(name="x", arch="decoder", num_layers=1, d_model=128, d_ff=256,
                  num_heads=2, d_kv=64, vocab_size=128)
  # params (sharded on model:2)                 | Adafactor slots (sharded)
  # embedding [vocab 128, d 128]: 8192          | [d 128] + [vocab 64] = 192
  # rms scale [128]: 128                        | [128] = 128
  # q, k, v [d 128, heads 128]: 3 * 8192        | each [heads 64] + [d 128] = 192
  # o [heads 128, d 128]: 8192                  | [d 128] + [heads 64] = 192
  # relative bias [heads 2, buckets 32]: 32     | unfactored (2 < 128): 32
  # rms scale [128]: 128                        | 128
  # wi [d 128, d_ff 256], wo: 2 * 16384         | each [d 128] + [d_ff 128] = 256
  # final rms scale: 128                        | 128
  params = 8192 + 128 + 3 * 8192 + 8192 + 32 + 128 + 2 * 16384 + 128
  slots = 192 + 128 + 3 * 192 + 192 + 32 + 128 + 2 * 256 + 128
  assert (params, slots) == (74144, 1888)
  assert models.bytes_per_device(m, MODEL_AXIS_2, MODEL_LAYOUT) == {
      "params": 4 * params, "optimizer": 4 * slots, "total": 4 * (params + slots)}


def test_adafactor_slot_dims():
  big = models.Variable("wi", (("d_model", 512), ("d_ff", 2048)))
  slots = models.adafactor_slot_dims(big)
  assert len(slots) == 2
  # mtf: vr = shape - d0 (largest), vc = shape - d1 (second largest)
  assert slots == [(("d_model", 512),), (("d_ff", 2048),)]
  assert sum(math.prod(s for _, s in slot) for slot in slots) == 512 + 2048

  small = models.Variable("x", (("a", 64), ("b", 32)))
  assert models.adafactor_slot_dims(small) == [(("a", 64), ("b", 32))]

  vector = models.Variable("scale", (("d_model", 4096),))
  assert models.adafactor_slot_dims(vector) == [(("d_model", 4096),)]

  # Only the second-largest dimension decides: [4096, 127] is not factored.
  edge = models.Variable("e", (("a", 4096), ("b", 127)))
  assert len(models.adafactor_slot_dims(edge)) == 1
  edge = models.Variable("e", (("a", 4096), ("b", 128)))
  assert len(models.adafactor_slot_dims(edge)) == 2


# models.variables against mesh_tensorflow's real variables: with the mtf trainers
# tests/integration/test_mtf_tfds.py builds anyway (an mtf graph is 5-10 s to build).
