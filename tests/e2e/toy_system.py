"""A whole system in one module, from outside tf_tput: what docs/extending.md says a
new system provides. tests/e2e/test_toy_system.py installs it as a plugin (an
entry point in the group tf_tput.systems) and runs it through train, suite and report.

It trains a real, tiny model in numpy: one logit per vocabulary entry (a unigram
language model), fitted by gradient descent on the target tokens of each batch. Its
runtime is numpy on this host's CPU: virtual devices are names, the peak probe a
numpy matmul.
"""

import numpy as np

from tf_tput import models
from tf_tput.errors import UsageError
from tf_tput.measure import peak
from tf_tput.records import provenance
from tf_tput.runtime import topology as topology_lib
from tf_tput import systems
from tf_tput import runtime as runtime_lib

LEARNING_RATE = 1.0


class NumpyRuntime(runtime_lib.Runtime):
  name = "numpy"
  finds_local_tpus = False
  serves_workers = False

  def check(self, strategy, every_worker, cluster_timeout_s):
    """Nothing in the environment to check."""

  def resolve(self, num_cpu_devices=None, strategy="local", every_worker=False,
              cluster_timeout_s=60.0, tpu_address=None):
    count = num_cpu_devices or 1
    return topology_lib.Topology(self.name, "cpu", tuple(f"cpu:{i}" for i in range(count)),
                                 provenance.cpu_model())

  def matmul_runner(self, topology, n, dtype):
    a = np.ones((n, n), dtype=np.float32)  # numpy has no bfloat16; float32 it is
    return lambda: peak.check_matmul_corner((a @ a)[0, 0], n, f"numpy {dtype} peak probe")

  def barrier(self, topology):
    return lambda name: None

  def launch_workers(self, *args, **kwargs):
    raise UsageError("the toy system has no worker servers")


class UnigramTrainer(systems.Trainer):
  def __init__(self, experiment, topology):
    self._vocab = models.padded_vocab(experiment.model.vocab_size)
    self._logits = np.zeros(self._vocab, dtype=np.float64)
    self.num_params = self._logits.size

  def step(self, batch):
    targets = np.asarray(batch["targets"]).ravel()
    targets = targets[targets != 0]  # 0 pads
    counts = np.bincount(targets, minlength=self._vocab) / max(1, targets.size)
    log_probs = self._logits - np.logaddexp.reduce(self._logits)
    loss = -float(counts @ log_probs)
    self._logits -= LEARNING_RATE * (np.exp(log_probs) - counts)  # d loss / d logits
    return loss

  def device_memory_bytes(self):
    return None

  def close(self):
    pass


class ToySystem(systems.System):
  name = "toy"
  runtime = NumpyRuntime()
  distributions = {"numpy": ("numpy",)}
  multi_process = False
  strategies = ("local",)
  every_worker = False
  embeddings = ("one_hot", "gather")  # it embeds nothing, so either binding is fine
  pipelines = False
  islands = ()
  traces = ()

  def check(self, experiment, strategy):
    """Any mesh: the toy replicates nothing and splits nothing."""

  def build(self, experiment, topology):
    return UnigramTrainer(experiment, topology)


SYSTEM = ToySystem()
