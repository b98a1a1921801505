"""Framework-neutral input batches: dicts of int32 numpy arrays, the same for every system.

Keys follow mesh_tensorflow.transformer: "targets" always, "inputs" for encoder-decoder
models, and "{inputs,targets}_segmentation" / "_position" when examples are packed.
Id 0 is padding, 1 is EOS. Synthetic data (the default) is seeded and has no padding;
tfds text is byte-encoded and padded or packed, and then padding counts.
"""

import itertools
import queue
import threading
from typing import Generator, Iterator, Optional, Protocol

import numpy as np

from tf_tput.config import DataConfig, Experiment
from tf_tput import errors
from tf_tput.errors import UsageError

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
FEATURES = ("inputs", "targets")


class ByteVocabulary:
  """UTF-8 bytes shifted past the three special ids (as T5's ByteVocabulary)."""
  num_special = 3
  size = 256 + num_special

  def encode(self, text) -> list:
    data = text if isinstance(text, bytes) else str(text).encode("utf-8")
    return [b + self.num_special for b in data]

  def decode(self, ids) -> str:
    return bytes(i - self.num_special for i in ids
                 if i >= self.num_special).decode("utf-8", errors="replace")


TOKEN_BYTES = np.dtype(np.int32).itemsize  # of every id a synthetic batch holds


def features_of(experiment: Experiment) -> tuple:
  return FEATURES if experiment.model.arch == "encoder_decoder" else ("targets",)


def lengths_of(experiment: Experiment) -> dict:
  d = experiment.data
  return {"inputs": d.inputs_length, "targets": d.targets_length}


def count_tokens(batch: dict) -> tuple:
  """(non-padding tokens, all positions) over the model's inputs and targets."""
  arrays = [batch[k] for k in FEATURES if k in batch]
  return (int(sum(np.count_nonzero(a) for a in arrays)), int(sum(a.size for a in arrays)))


# Distinct synthetic batches built before the clock starts, then cycled: enough that a
# run does not train on one batch, few enough that building them stays quick. The
# byte bound keeps paper-scale batches (Table 2: 2048 x 1024 int32 = 8 MiB each) from
# filling the host: 64 of those would be 512 MiB and take many seconds to draw.
RING_CAP = 64
RING_BYTES = 64 << 20
# tfds batches a background thread keeps ready ahead of the loop.
PREFETCH_DEPTH = 4


class Batches(Protocol):
  """What batches() returns, whatever the source: an iterator its caller closes."""

  def __iter__(self) -> "Batches": ...

  def __next__(self) -> dict: ...

  def close(self) -> None: ...


def batches(experiment: Experiment, count: Optional[int] = None) -> Batches:
  """An endless iterator of global batches for this experiment, ready before timing;
  close() ends it.

  Synthetic: ring_size(experiment, count) distinct batches (count: the steps that
  will be run; default the experiment's warmup + measured steps) are generated now and
  cycled, so no generation lands inside a measured step. tfds: read and encoded by a
  background thread PREFETCH_DEPTH batches ahead (close() stops it).
  """
  if experiment.data.source == "synthetic":
    return ring(_synthetic(experiment), ring_size(experiment, count))
  return Prefetched(_tfds(experiment), PREFETCH_DEPTH)


def ring_size(experiment: Experiment, count: Optional[int] = None) -> int:
  """min(count, RING_CAP, as many batches as fit in RING_BYTES), at least 1."""
  t, lengths = experiment.train, lengths_of(experiment)
  batch_bytes = 4 * t.global_batch * sum(lengths[k] for k in features_of(experiment))
  return max(1, min(count or t.warmup_steps + t.steps, RING_CAP, RING_BYTES // batch_bytes))


def host_bytes(experiment: Experiment) -> int:
  """Host memory the batches hold at once, at most: synthetic, the ring plus one
  batch's drawing (a float64 draw and its int64 index per token, beside the int32 ids);
  tfds, the prefetched batches and the rows stacked into one (packing adds segment and
  position rows). What tf_tput.train checks against the host's memory before it starts."""
  t, lengths = experiment.train, lengths_of(experiment)
  tokens = t.global_batch * sum(lengths[k] for k in features_of(experiment))
  if experiment.data.source == "synthetic":
    return 4 * tokens * ring_size(experiment) + (8 + 8) * tokens
  per_batch = 4 * tokens * (3 if experiment.data.pack else 1)
  return per_batch * (PREFETCH_DEPTH + 3)


def ring(source: Iterator[dict], count: int) -> Generator[dict, None, None]:
  """`count` batches drawn from `source` now, then cycled forever; a generator, so
  that it has close() as every Batches has (nothing runs behind it to stop)."""
  drawn = [next(source) for _ in range(max(1, count))]
  return (batch for batch in itertools.cycle(drawn))


class Prefetched:
  """Iterates `source` on a daemon thread into a queue of at most `depth` items.

  The source's exception (e.g. an empty dataset's UsageError) is raised by the
  next() that would have returned the item. The first item is awaited here, so a
  wrong dataset still fails before training.
  """
  _END = object()

  def __init__(self, source: Iterator[dict], depth: int):
    self._queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._first = next(source)  # fails now, in this thread, if it fails
    self._thread = threading.Thread(target=self._fill, args=(source,), daemon=True)
    self._thread.start()

  def _fill(self, source) -> None:
    while not self._stop.is_set():
      try:
        item = next(source)
      except BaseException as e:  # noqa: BLE001 - handed to the consumer, not lost
        item = (self._END, e)
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if isinstance(item, tuple) and item and item[0] is self._END:
        return

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._first is not None:
      item, self._first = self._first, None
      return item
    item = self._queue.get()
    if isinstance(item, tuple) and item and item[0] is self._END:
      self._queue.put(item)  # later calls raise the same
      raise item[1]
    return item

  def close(self) -> None:
    self._stop.set()
    self._thread.join(timeout=5)


def _synthetic(experiment: Experiment) -> Iterator[dict]:
  """Seeded tokens from a fixed Zipf-like unigram distribution, no padding.

  A skewed distribution (rather than uniform ids) gives the model something to learn,
  so a falling loss shows that training works; throughput does not depend on it.
  """
  rng = np.random.default_rng(experiment.train.seed)
  vocab = experiment.model.vocab_size
  ranks = np.arange(1, vocab - EOS_ID)  # ids 2 .. vocab-1
  cdf = np.cumsum(1.0 / ranks)
  cdf /= cdf[-1]
  order = rng.permutation(ranks) + EOS_ID  # which id gets which frequency
  shapes = {k: (experiment.train.global_batch, lengths_of(experiment)[k])
            for k in features_of(experiment)}
  while True:
    yield {k: order[np.searchsorted(cdf, rng.random(shape))].astype(np.int32)
           for k, shape in shapes.items()}


def _load_tfds(data: DataConfig):
  """The tfds dataset, loaded now so that a wrong name or data_dir fails before training."""
  import tensorflow_datasets as tfds  # imports TensorFlow; only on this path

  try:
    dataset = tfds.load(data.tfds_name, split=data.tfds_split, data_dir=data.data_dir,
                        shuffle_files=False)
  except Exception as e:  # noqa: BLE001 - tfds raises many types, all "cannot read it"
    raise UsageError(f"tfds dataset {data.tfds_name!r} split {data.tfds_split!r} "
                     f"(data_dir={data.data_dir!r}) cannot be loaded: "
                     f"{errors.one_line(e, 300)}; prepare it with tfds "
                     "or set DataConfig.data_dir") from None
  features = sorted(dataset.element_spec)
  if data.text_key not in features:
    raise UsageError(f"tfds dataset {data.tfds_name!r} has no feature {data.text_key!r} "
                     f"(features: {features}); set DataConfig.text_key")
  return dataset


def _text_examples(dataset, data: DataConfig, features: tuple) -> Iterator[dict]:
  """Byte-encoded examples from a tfds text dataset, repeated forever."""
  import tensorflow_datasets as tfds

  vocab = ByteVocabulary()
  while True:
    seen = 0
    for example in tfds.as_numpy(dataset):
      ids = vocab.encode(example[data.text_key])
      seen += 1
      if features == ("targets",):
        yield {"targets": ids + [EOS_ID]}
      else:  # prefix -> continuation: the text's first half is the encoder input
        half = max(1, len(ids) // 2)
        yield {"inputs": ids[:half] + [EOS_ID], "targets": ids[half:] + [EOS_ID]}
    if not seen:
      raise UsageError(f"tfds dataset {data.tfds_name!r} split {data.tfds_split!r} "
                       "is empty; choose another split")


def _tfds(experiment: Experiment) -> Iterator[dict]:
  if experiment.model.vocab_size < ByteVocabulary.size:
    raise UsageError(f"ModelConfig.vocab_size = {experiment.model.vocab_size} is smaller "
                     f"than the byte vocabulary ({ByteVocabulary.size}); use a larger model")
  features, lengths = features_of(experiment), lengths_of(experiment)
  rows = _pack if experiment.data.pack else _pad
  examples = _text_examples(_load_tfds(experiment.data), experiment.data, features)
  return _stack_rows(rows(examples, features, lengths), experiment.train.global_batch)


def _pad(examples, features, lengths) -> Iterator[dict]:
  """One example per row, truncated and padded with PAD_ID."""
  for example in examples:
    row = {}
    for k in features:
      ids = example[k][:lengths[k]]
      row[k] = np.pad(np.asarray(ids, np.int32), (0, lengths[k] - len(ids)))
    yield row


def _pack(examples, features, lengths) -> Iterator[dict]:
  """Greedy packing: examples are appended to a row while every feature still fits.

  Each packed example gets a segment id (1, 2, ...) and positions restarting at 0, so
  attention stays within the example, as in mesh_tensorflow's pack_dataset.
  """
  def empty():
    return {k: [] for k in features}, {k: [] for k in features}, {k: [] for k in features}

  ids, segments, positions = empty()
  segment = 0
  for example in examples:
    example = {k: example[k][:lengths[k]] for k in features}
    if any(len(ids[k]) + len(example[k]) > lengths[k] for k in features):
      yield _packed_row(ids, segments, positions, features, lengths)
      ids, segments, positions = empty()
      segment = 0
    segment += 1
    for k in features:
      ids[k] += example[k]
      segments[k] += [segment] * len(example[k])
      positions[k] += list(range(len(example[k])))


def _packed_row(ids, segments, positions, features, lengths) -> dict:
  row = {}
  for k in features:
    pad = (0, lengths[k] - len(ids[k]))
    row[k] = np.pad(np.asarray(ids[k], np.int32), pad)
    row[f"{k}_segmentation"] = np.pad(np.asarray(segments[k], np.int32), pad)
    row[f"{k}_position"] = np.pad(np.asarray(positions[k], np.int32), pad)
  return row


def _stack_rows(rows: Iterator[dict], batch_size: int) -> Iterator[dict]:
  while True:
    chunk = [next(rows) for _ in range(batch_size)]
    yield {k: np.stack([row[k] for row in chunk]) for k in chunk[0]}
