"""mesh_tensorflow's reference training runs, computed once per test session.

test_jax_model.py and test_tf2_model.py compare their systems with the same mtf runs
(an mtf trainer's initial weights, then its losses over the same synthetic batches).
Under scripts/test.sh the two files run in different xdist workers, so each run is
kept on disk in the session's cache directory (tests/conftest.py: one directory that
every worker shares, removed at exit): the first process to ask computes it under a
per-run lock, any other waits on the lock and reads it. An lru_cache keeps it in
each process. Every consumer draws its own batches: data.batches is deterministic.
"""

import dataclasses
import fcntl
import functools
import hashlib
import itertools
import json
import os
import tempfile

import numpy as np

from tf_tput import config
from tf_tput import data
from tf_tput.runtime.topology import Topology

SUBDIR = "mtf-references"  # under XDG_CACHE_HOME: conftest.py's session directory
PADDED_SEED = 1
# What the files comparing with these runs share, so that they ask for the same runs:
# the optimizer steps compared, and a configuration whose weights Adafactor factors
# (d_model 128 and 8 heads: embedding, q/k/v/o and wi/wo have two dims >= 128; the
# tiny models factor nothing).
STEPS = 10
FACTORED = ("ModelConfig.d_model = 128", "ModelConfig.num_heads = 8")


@dataclasses.dataclass(frozen=True)
class Reference:
  """`steps` Adafactor steps of the mtf trainer on data.batches(experiment)."""
  initial: dict        # {mtf variable name: np.ndarray}, export_variables() at build
  losses: tuple        # trainer.step's loss, one float per step
  trained: dict        # export_variables() after the steps
  padded_loss: float   # then one more step, on padded_batch(experiment): its loss


def _experiment(name: str, params=()):
  return config.load_experiment([f"gin/models/{name}.gin"], list(params))


def padded(batch: dict, rng) -> dict:
  """Each row cut at a random length and padded with 0 (tests the padding masks)."""
  batch = {k: v.copy() for k, v in batch.items()}
  for k in data.FEATURES:
    for row in batch.get(k, []):
      row[int(rng.integers(5, row.size)):] = data.PAD_ID
  return batch


def padded_batch(experiment) -> dict:
  """The first batch padded at seeded lengths: Reference.padded_loss's batch."""
  return padded(next(data.batches(experiment)), np.random.default_rng(PADDED_SEED))


@functools.lru_cache(maxsize=None)
def training_run(name: str, params: tuple = (), steps: int = 10) -> Reference:
  """The mtf trainer of gin/models/{name}.gin with params (gin bindings) after `steps`
  steps: computed by the first process of the session that asks, read by the others."""
  key = hashlib.sha256(json.dumps([name, list(params), steps]).encode()).hexdigest()[:16]
  directory = os.path.join(os.environ["XDG_CACHE_HOME"], SUBDIR)
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, f"{name}-{steps}-{key}")
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # released when the file closes
    if not os.path.exists(path + ".json"):
      _write(path, _compute(name, params, steps))
    return _read(path)


def _compute(name: str, params: tuple, steps: int) -> Reference:
  from tf_tput.systems.tensorflow.mtf import system as mtf
  e = _experiment(name, params)
  trainer = mtf.SYSTEM.build(e, Topology("tf", "cpu", ("",), "cpu"))
  try:
    initial = trainer.export_variables()
    losses = tuple(trainer.step(b) for b in itertools.islice(data.batches(e), steps))
    trained = trainer.export_variables()
    return Reference(initial, losses, trained, trainer.step(padded_batch(e)))
  finally:
    trainer.close()


def _write(path: str, reference: Reference) -> None:
  """The arrays (npz), then the names and losses (json): the json, replaced last,
  says the run is whole. Each through a temporary file and os.replace."""
  names = list(reference.initial)
  assert list(reference.trained) == names
  arrays = [reference.initial[k] for k in names] + [reference.trained[k] for k in names]
  _replace(path + ".npz", lambda f: np.savez(f, *arrays))
  meta = {"names": names, "losses": list(reference.losses),
          "padded_loss": reference.padded_loss}
  _replace(path + ".json", lambda f: f.write(json.dumps(meta).encode()))


def _replace(path: str, write) -> None:
  fd, scratch = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".scratch-")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(scratch, path)
  except BaseException:
    os.unlink(scratch)
    raise


def _read(path: str) -> Reference:
  with open(path + ".json") as f:
    meta = json.load(f)
  names = meta["names"]
  with np.load(path + ".npz") as npz:
    arrays = [npz[f"arr_{i}"] for i in range(2 * len(names))]
  return Reference(initial=dict(zip(names, arrays[:len(names)], strict=True)),
                   losses=tuple(meta["losses"]),
                   trained=dict(zip(names, arrays[len(names):], strict=True)),
                   padded_loss=meta["padded_loss"])
