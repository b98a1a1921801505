"""--system=tf2: the same gin model in TensorFlow 2, trained under a tf.distribute strategy.

model.py holds the model (jax/model.py's numerics, which are mtf's) and mtf's
Adafactor; this module holds its tf.Variables (named by tf_tput.models.variables) and
runs one step as a tf.function around one strategy.run:

* one device: no replication (the default strategy);
* several local devices (GPUs, or virtual CPUs from --num_cpu_devices): a
  MirroredStrategy over topology.devices; the workers of tf_tput.launch
  --num_workers (--strategy=multi_worker): the MultiWorkerMirroredStrategy
  systems/tensorflow/runtime.py made, every worker running this same program; a Cloud TPU
  (--strategy=tpu): the TPUStrategy systems/tensorflow/runtime.py made (systems/tensorflow/tpu.py;
  never run here: no TPU). Each replica gets its slice of the same
  numpy global batch (experimental_distribute_values_from_function) and computes its
  loss with the global batch's denominator, so the SUM of the replicas' losses is
  mtf's loss on the global batch and the SUM of their gradients is its gradient; the
  strategy all-reduces the gradients (batch_reduce_to) and every replica applies the
  same Adafactor update to its copy (extended.update).

Strategies replicate every variable: the mesh must be data parallel only
(check_mesh, which needs no TensorFlow; Tf2System.check runs it before any framework
starts). Model parallelism is --system=mtf's or --system=jax's.
"""

from typing import Optional

import numpy as np

from tf_tput import models, systems
from tf_tput.errors import UsageError
from tf_tput.numerics import check_variable_names
from tf_tput.systems.tensorflow import runtime as tf_runtime


def replica_axis(experiment) -> Optional[str]:
  """The mesh axis the batch is split over (the layout's rule for "batch")."""
  return experiment.layout.get("batch")


def num_replicas(experiment) -> int:
  return experiment.mesh_shape.get(replica_axis(experiment), 1)


def check_mesh(experiment) -> None:
  """Strategies replicate: a data-parallel mesh only (one UsageError line)."""
  systems.check_data_parallel("tf2", experiment,
                              "tf.distribute strategies replicate every variable")


class Tf2Trainer(systems.Trainer):
  """tf.Variables under a strategy; step() runs one replicated Adafactor update."""

  def __init__(self, experiment, topology):
    import tensorflow as tf
    from tf_tput.systems.tensorflow.tf2 import model as tf2_model

    check_mesh(experiment)
    self._tf = tf
    m = experiment.model
    replicas = num_replicas(experiment)
    if replicas > 1:
      if len(topology.devices) < replicas:
        raise UsageError(f"mesh {experiment.mesh.mesh_shape!r} needs {replicas} devices; "
                         f"the topology has {len(topology.devices)}")
      self._devices = list(topology.devices[:replicas])
      # multi_worker: the MultiWorkerMirroredStrategy topology made before any op ran.
      self._strategy = (topology.handles.get("strategy")
                        or tf.distribute.MirroredStrategy(self._devices))
    else:
      self._strategy = tf.distribute.get_strategy()  # the default: no replication
    self._replicas = replicas
    global_batch = experiment.train.global_batch
    if global_batch % replicas:
      raise UsageError(f"TrainConfig.global_batch = {global_batch} does not split over "
                       f"{replicas} replicas")
    self._per_replica = global_batch // replicas
    self._optimizer = tf2_model.Adafactor(m.activation_dtype)
    variables = models.variables(m)
    self._names = [v.name for v in variables]
    initial = tf2_model.init_params(m, experiment.train.seed)
    with self._strategy.scope():
      self._vars = {name: tf.Variable(initial[name], name=name.replace("/", "."),
                                      trainable=True) for name in self._names}
      self._slots = {
          name: {slot: tf.Variable(tf.zeros(shape, tf.float32), trainable=False,
                                   name=f"{name.replace('/', '.')}_slot_{slot}")
                 for slot, shape in tf2_model.Adafactor.slot_shapes(
                     tuple(self._vars[name].shape)).items()}
          for name in self._names}
      self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="global_step")
    self.num_params = sum(int(np.prod(v.shape)) for v in self._vars.values())
    self._gpu_names = [d.split("device:")[-1] for d in topology.devices if "GPU" in d]
    strategy = self._strategy
    names = self._names
    optimizer = self._optimizer

    def replica_step(batch, denominator):
      with tf.GradientTape() as tape:
        loss = tf2_model.loss_fn(self._vars, batch, m, denominator=denominator)
      grads = tape.gradient(loss, [self._vars[n] for n in names])
      return loss, grads

    def apply(var, grad, name):
      optimizer.apply_grad(var, grad, self._slots[name], self._global_step)

    @tf.function
    def train_step(batch, denominator):
      losses, grads = strategy.run(replica_step, args=(batch, denominator))
      variables = [self._vars[n] for n in names]
      # The replicas' gradients summed and placed on each variable's devices.
      reduced = strategy.extended.batch_reduce_to(
          tf.distribute.ReduceOp.SUM, list(zip(grads, variables, strict=True)))
      for name, var, grad in zip(names, variables, reduced, strict=True):
        strategy.extended.update(var, apply, args=(grad, name), group=False)
      # Reads of the step above come first (automatic control dependencies).
      strategy.extended.update(self._global_step, lambda s: s.assign_add(1), group=False)
      return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    self._train_step = train_step

  def _distributed(self, batch: dict):
    tf = self._tf
    if self._replicas == 1:
      return {k: tf.constant(v) for k, v in batch.items()}
    size = self._per_replica

    def value_fn(context):  # replica i's rows, on replica i's device
      i = context.replica_id_in_sync_group
      with tf.device(self._devices[i]):
        return {k: tf.identity(v[i * size:(i + 1) * size]) for k, v in batch.items()}
    return self._strategy.experimental_distribute_values_from_function(value_fn)

  def step(self, batch: dict) -> float:
    denominator = int(np.prod(batch["targets"].shape))  # the global batch's, a constant
    loss = self._train_step(self._distributed(batch), denominator)
    return float(loss)

  def load_variables(self, values: dict) -> None:
    """Replaces the parameters (e.g. mtf's initial values) and resets Adafactor."""
    check_variable_names(self._names, values)
    for name in self._names:
      self._vars[name].assign(np.asarray(values[name], np.float32))
      for slot in self._slots[name].values():
        slot.assign(self._tf.zeros(slot.shape, self._tf.float32))
    self._global_step.assign(0)

  def export_variables(self) -> dict:
    return {name: np.asarray(self._vars[name].numpy()) for name in self._names}

  def device_memory_bytes(self) -> Optional[int]:
    return tf_runtime.gpu_peak_bytes(self._tf, self._gpu_names)

  def close(self) -> None:
    self._vars = self._slots = self._train_step = None


class Tf2System(systems.System):
  name = "tf2"
  runtime = tf_runtime.RUNTIME
  distributions = {"tensorflow": ("tensorflow", "tensorflow-cpu")}
  multi_process = True    # as workers of tf_tput.launch --num_workers (multi_worker)
  strategies = ("local", "multi_worker", "tpu")  # tpu: TPUStrategy, never run here
  every_worker = True  # MultiWorkerMirroredStrategy: each worker runs the program
  embeddings = ("one_hot", "gather")
  pipelines = False
  islands = ()
  traces = ()

  def check(self, experiment, strategy: str) -> None:
    check_mesh(experiment)  # strategies replicate: a data-parallel mesh only

  def build(self, experiment, topology) -> Tf2Trainer:
    check_mesh(experiment)
    return Tf2Trainer(experiment, topology)


SYSTEM = Tf2System()
