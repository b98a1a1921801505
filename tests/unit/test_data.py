"""tf_tput/data.py: synthetic batches, token counting, byte vocabulary, padding and
packing, and the tfds path (on tfds's mock data, offline)."""

import itertools

import numpy as np
import pytest

from tf_tput import config
from tf_tput import data


def _experiment(model="t5_tiny", *params):
  return config.load_experiment(
      [f"gin/models/{model}.gin"],
      ["TrainConfig.global_batch = 3", "DataConfig.inputs_length = 7",
       "DataConfig.targets_length = 5", *params])


# --------------------------------------------------------------------------------------
# Synthetic batches.

def test_synthetic_shapes_encoder_decoder():
  batch = next(data.batches(_experiment("t5_tiny")))
  assert set(batch) == {"inputs", "targets"}
  assert batch["inputs"].shape == (3, 7)
  assert batch["targets"].shape == (3, 5)
  assert all(a.dtype == np.int32 for a in batch.values())


def test_synthetic_shapes_decoder():
  batch = next(data.batches(_experiment("decoder_tiny")))
  assert set(batch) == {"targets"}
  assert batch["targets"].shape == (3, 5)


def test_synthetic_deterministic_per_seed():
  a = list(itertools.islice(data.batches(_experiment("t5_tiny", "TrainConfig.seed = 1")), 3))
  b = list(itertools.islice(data.batches(_experiment("t5_tiny", "TrainConfig.seed = 1")), 3))
  c = list(itertools.islice(data.batches(_experiment("t5_tiny", "TrainConfig.seed = 2")), 3))
  for x, y in zip(a, b, strict=True):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  assert any(not np.array_equal(x[k], z[k]) for x, z in zip(a, c, strict=True) for k in x)
  # Successive batches differ.
  assert not np.array_equal(a[0]["targets"], a[1]["targets"])


def test_synthetic_no_padding_and_ids_in_vocab():
  e = _experiment("t5_tiny", "ModelConfig.vocab_size = 300", "TrainConfig.global_batch = 16",
                  "DataConfig.inputs_length = 64", "DataConfig.targets_length = 64")
  for batch in itertools.islice(data.batches(e), 5):
    for a in batch.values():
      assert a.min() >= 2            # no padding (0), no EOS (1)
      assert a.max() < 300
  tokens, padded = data.count_tokens(batch)
  assert tokens == padded == 16 * 64 * 2


# --------------------------------------------------------------------------------------
# Token counting and the vocabulary.

def test_count_tokens():
  batch = {"inputs": np.array([[3, 4, 0], [5, 0, 0]], np.int32),
           "targets": np.array([[6, 1, 0, 0]], np.int32),
           "targets_segmentation": np.array([[1, 1, 0, 0]], np.int32)}  # not counted
  assert data.count_tokens(batch) == (5, 10)   # 3, 4, 5 and 6, 1 of 6 + 4 positions
  assert data.count_tokens({"targets": np.zeros((2, 3), np.int32)}) == (0, 6)


def test_byte_vocabulary_round_trip():
  vocab = data.ByteVocabulary()
  assert vocab.size == 259
  for text in ["hello", "", "naïve — ünïcödé ✓", "a\nb\tc"]:
    ids = vocab.encode(text)
    assert all(3 <= i < vocab.size for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert vocab.decode(ids) == text
  assert vocab.encode(b"\x00\xff") == [3, 258]
  # Special ids (pad, EOS, UNK) are dropped on decoding.
  assert vocab.decode([104 + 3, 0, 1, 2, 105 + 3]) == "hi"


# --------------------------------------------------------------------------------------
# Padding and packing.

def test_pad_truncates_and_pads():
  examples = [{"inputs": [5, 6, 1], "targets": [7, 1]},
              {"inputs": [8, 9, 10, 11, 12, 1], "targets": [13, 14, 15, 1]}]
  rows = list(data._pad(iter(examples), ("inputs", "targets"),
                        {"inputs": 4, "targets": 3}))
  assert len(rows) == 2
  np.testing.assert_array_equal(rows[0]["inputs"], [5, 6, 1, 0])
  np.testing.assert_array_equal(rows[0]["targets"], [7, 1, 0])
  np.testing.assert_array_equal(rows[1]["inputs"], [8, 9, 10, 11])
  np.testing.assert_array_equal(rows[1]["targets"], [13, 14, 15])
  assert set(rows[0]) == {"inputs", "targets"}
  assert rows[0]["inputs"].dtype == np.int32


def test_pack_decoder_rows():
  examples = [{"targets": t} for t in ([5, 6, 1], [7, 1], [8, 9, 10, 1], [11, 1],
                                       [12, 13, 14, 15, 16, 17, 18, 1], [19, 1])]
  rows = list(itertools.islice(data._pack(iter(examples), ("targets",), {"targets": 6}),
                               3))
  expected = [
      # ids                   segmentation         positions
      ([5, 6, 1, 7, 1, 0],    [1, 1, 1, 2, 2, 0],  [0, 1, 2, 0, 1, 0]),
      ([8, 9, 10, 1, 11, 1],  [1, 1, 1, 1, 2, 2],  [0, 1, 2, 3, 0, 1]),
      ([12, 13, 14, 15, 16, 17], [1] * 6,          [0, 1, 2, 3, 4, 5]),  # truncated
  ]
  assert len(rows) == 3
  for row, (ids, seg, pos) in zip(rows, expected, strict=True):
    assert set(row) == {"targets", "targets_segmentation", "targets_position"}
    np.testing.assert_array_equal(row["targets"], ids)
    np.testing.assert_array_equal(row["targets_segmentation"], seg)
    np.testing.assert_array_equal(row["targets_position"], pos)


def test_pack_encoder_decoder_starts_row_when_any_feature_is_full():
  examples = [{"inputs": [5, 1], "targets": [6, 7, 1]},
              {"inputs": [8, 1], "targets": [9, 1]},        # fits both
              {"inputs": [10, 1], "targets": [11, 1]}]      # inputs would be 6 > 5
  rows = list(itertools.islice(
      data._pack(iter(examples + examples), ("inputs", "targets"),
                 {"inputs": 5, "targets": 8}), 2))
  r = rows[0]
  np.testing.assert_array_equal(r["inputs"], [5, 1, 8, 1, 0])
  np.testing.assert_array_equal(r["inputs_segmentation"], [1, 1, 2, 2, 0])
  np.testing.assert_array_equal(r["inputs_position"], [0, 1, 0, 1, 0])
  np.testing.assert_array_equal(r["targets"], [6, 7, 1, 9, 1, 0, 0, 0])
  np.testing.assert_array_equal(r["targets_segmentation"], [1, 1, 1, 2, 2, 0, 0, 0])
  np.testing.assert_array_equal(r["targets_position"], [0, 1, 2, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(rows[1]["inputs"], [10, 1, 5, 1, 0])
  np.testing.assert_array_equal(rows[1]["targets"], [11, 1, 6, 7, 1, 0, 0, 0])


def _segments(row, key):
  """The examples of one packed row, split by segment id."""
  ids, seg = row[key], row[f"{key}_segmentation"]
  return [list(ids[seg == s]) for s in range(1, seg.max() + 1)]


def test_pack_never_splits_an_example():
  rng = np.random.default_rng(0)
  examples = [{"targets": list(rng.integers(3, 200, rng.integers(1, 9))) + [1]}
              for _ in range(200)]
  rows = list(itertools.islice(data._pack(iter(examples), ("targets",),
                                          {"targets": 16}), 40))
  unpacked = [seg for row in rows for seg in _segments(row, "targets")]
  # Every example appears whole, in order, in exactly one row.
  assert unpacked == [e["targets"] for e in examples[:len(unpacked)]]
  for row in rows:
    seg = row["targets_segmentation"]
    assert np.all((row["targets"] == 0) == (seg == 0))
    # Positions restart at 0 at each segment start.
    starts = np.flatnonzero(np.diff(np.concatenate([[0], seg])) != 0)
    assert np.all(row["targets_position"][starts[seg[starts] > 0]] == 0)


def test_stack_rows():
  rows = iter([{"t": np.array([i, i])} for i in range(6)])
  batches = data._stack_rows(rows, 3)
  np.testing.assert_array_equal(next(batches)["t"], [[0, 0], [1, 1], [2, 2]])
  np.testing.assert_array_equal(next(batches)["t"], [[3, 3], [4, 4], [5, 5]])


# --------------------------------------------------------------------------------------
# tfds (mock data for lm1b: offline, generated from the dataset's feature spec).

def _tfds_experiment(model, pack, length=64):
  return config.load_experiment(
      [f"gin/models/{model}.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       f"DataConfig.inputs_length = {length}", f"DataConfig.targets_length = {length}",
       f"DataConfig.pack = {pack}", "TrainConfig.global_batch = 8"])


@pytest.fixture(scope="module")
def mock_lm1b():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=20, policy=tfds.testing.MockPolicy.USE_CODE):
    yield


@pytest.mark.parametrize("model", ["decoder_tiny", "t5_tiny"])
def test_tfds_padding_and_packing(mock_lm1b, model):
  plain = _tfds_experiment(model, pack=False)
  packed = _tfds_experiment(model, pack=True)
  features = data.features_of(plain)
  b_plain = next(data.batches(plain))
  b_packed = next(data.batches(packed))

  assert set(b_plain) == set(features)
  assert set(b_packed) == {f"{k}{s}" for k in features
                           for s in ("", "_segmentation", "_position")}
  for k in features:
    assert b_plain[k].shape == b_packed[k].shape == (8, 64)
    for b in (b_plain, b_packed):
      nonpad = b[k][b[k] != 0]
      assert nonpad.min() >= 1 and nonpad.max() < data.ByteVocabulary.size
      # Every row ends its text with EOS (mock texts are shorter than 64 bytes).
      assert np.all(np.any(b[k] == data.EOS_ID, axis=1))

  tokens, padded = data.count_tokens(b_plain)
  assert padded == 8 * 64 * len(features)
  assert padded > tokens
  packed_tokens, packed_padded = data.count_tokens(b_packed)
  assert packed_padded == padded
  # Packing fills rows with more examples: less padding in the same positions.
  assert packed_tokens > tokens
  assert (packed_padded - packed_tokens) < (padded - tokens)
  for k in features:
    assert b_packed[f"{k}_segmentation"].max() > 1


def test_tfds_packed_examples_match_unpacked(mock_lm1b):
  """Packed rows hold the same examples, whole and in order, as unpacked rows."""
  plain = next(data.batches(_tfds_experiment("decoder_tiny", pack=False)))
  packed = next(data.batches(_tfds_experiment("decoder_tiny", pack=True)))
  unpacked = [seg for row in range(8) for seg in _segments(
      {k: v[row] for k, v in packed.items()}, "targets")]
  originals = [list(row[row != 0]) for row in plain["targets"]]
  assert len(unpacked) > 8
  assert unpacked[:8] == originals
  assert all(seg[-1] == data.EOS_ID for seg in unpacked)


def test_tfds_vocab_too_small(mock_lm1b):
  e = config.load_experiment(
      ["gin/models/decoder_tiny.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       "ModelConfig.vocab_size = 256"])
  with pytest.raises(data.UsageError, match="vocab_size"):
    next(data.batches(e))


def test_tfds_missing_text_key(mock_lm1b):
  e = config.load_experiment(
      ["gin/models/decoder_tiny.gin"],
      ["DataConfig.source = 'tfds'", "DataConfig.tfds_name = 'lm1b'",
       "DataConfig.text_key = 'body'"])
  with pytest.raises(data.UsageError, match="body"):
    next(data.batches(e))


def test_prefetched_batches_come_in_order_and_the_sources_error_is_raised():
  def source():
    yield from ({"targets": np.full((1, 2), i, np.int32)} for i in range(3))
    raise ValueError("dataset broke")
  batches = data.Prefetched(source(), depth=2)
  try:
    assert [int(next(batches)["targets"][0, 0]) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="dataset broke"):
      next(batches)
  finally:
    batches.close()


def test_synthetic_batches_are_a_ring_of_distinct_batches():
  e = _experiment("t5_tiny")
  batches = data.batches(e, count=3)
  ring = list(itertools.islice(batches, 6))
  assert ring[3] is ring[0] and ring[4] is ring[1]   # built once, cycled
  assert not np.array_equal(ring[0]["targets"], ring[1]["targets"])
  batches.close()  # every source's batches close (callers never ask whether they do)
  with pytest.raises(StopIteration):
    next(batches)


def test_the_ring_is_bounded_by_steps_count_and_bytes():
  e = _experiment("t5_tiny", "TrainConfig.warmup_steps = 2", "TrainConfig.steps = 4")
  assert data.ring_size(e) == 6                  # warmup + measured steps
  assert data.ring_size(e, count=500) == data.RING_CAP
  big = _experiment("decoder_tiny", "TrainConfig.global_batch = 2048",
                    "DataConfig.targets_length = 1024", "TrainConfig.steps = 100")
  assert data.ring_size(big) == 8                # 8 MiB int32 batches in 64 MiB
  huge = _experiment("decoder_tiny", "TrainConfig.global_batch = 65536",
                     "DataConfig.targets_length = 1024")
  assert data.ring_size(huge) == 1               # still one batch, never none
