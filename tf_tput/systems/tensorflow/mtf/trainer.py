"""--system=mtf's Session trainer: the mtf graph (model.py) lowered by
PlacementMeshImpl onto the topology's devices and run by one tf.compat.v1 Session.
pipeline.py subclasses it; system.py (the System) chooses between them and imports
this module only when chosen, so no trainer module imports the System.
"""

import logging
import time
from typing import Optional

from tf_tput import compat, errors, reduction
from tf_tput.numerics import check_variable_names
from tf_tput.systems.tensorflow import cluster, runtime as tf_runtime
from tf_tput.systems.tensorflow.mtf import model as mtf_model
from tf_tput import systems

CLOSE_WAIT_S = 5.0
LOST_WORKER_SETTLE_S = 3.0


class MtfTrainer(systems.Trainer):
  """A lowered mtf graph in a Session; step() feeds one numpy batch.

  _build_model makes the loss and says how each mesh is lowered; everything around it
  (Adafactor, the global step, the Session, export, load, trace, close) is shared
  with the pipelined trainer (pipeline.MtfPipelineTrainer), which overrides it.
  """

  def __init__(self, experiment, topology):
    import tensorflow as tf
    mtf, mtf_t = compat.import_mtf()
    # mtf logs its graph and memory statistics at INFO through TensorFlow's logger.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    tf1 = tf.compat.v1
    self._tf = tf
    self._graph = tf.Graph()
    with self._graph.as_default():
      tf1.set_random_seed(experiment.train.seed)  # the same initial weights every run
      graph = mtf.Graph()
      self._placeholders = {}
      loss, mesh_to_impl = self._build_model(mtf, mtf_t, graph, experiment, topology)
      self.num_params = sum(v.shape.size for v in graph.trainable_variables)
      global_step = tf1.train.get_or_create_global_step()
      updates = mtf_model.optimizer_updates(mtf, graph, loss)
      # Before the Lowering stacks them: one master per variable, by its mtf name.
      loads = {}
      for v in graph.trainable_variables:
        master = v.get_master()
        value = tf1.placeholder(master.dtype, master.shape, name="load")
        loads[v.name] = (value, tf1.assign(master, value))
      self._loads = loads
      self.lowering = lowering = mtf.Lowering(graph, mesh_to_impl)
      self.analytic_link_bytes_per_step = self._analytic_link_bytes(
          graph, mesh_to_impl, experiment, topology)
      self._loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
      # Adafactor's step size and decay read the global step; incrementing it only
      # after every update keeps step k on k (mtf's own runner leaves them unordered).
      with tf.control_dependencies([lowering.lowered_operation(op) for op in updates]):
        self._train_op = tf1.assign_add(global_step, 1)
      init = tf1.global_variables_initializer()
      self._copy_masters_to_slices = lowering.copy_masters_to_slices()
      self._copy_slices_to_masters = lowering.copy_slices_to_masters()
      # Lowering "autostacks" same-shaped variables into one (mtf's default speed-up);
      # keep each master with the names of the variables it holds.
      self._masters = [(getattr(v, "original_names", None), v.name, v.get_master())
                       for v in graph.trainable_variables]
      self._graph.finalize()
    self._session = tf1.Session(topology.session_target, graph=self._graph)
    self._session.run(init)
    self._session.run(self._copy_masters_to_slices)
    self._workers = list(topology.workers)
    # get_memory_info sees this process's GPUs only, not a cluster's.
    self._gpu_names = [dev.split("device:")[-1] for dev in topology.devices
                       if "GPU" in dev and not topology.session_target]

  def _build_model(self, mtf, mtf_t, graph, experiment, topology):
    """(the loss, {mtf.Mesh: MeshImpl}); fills self._placeholders."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    mesh = mtf.Mesh(graph, "mesh")
    batch_dim = mtf.Dimension("batch", experiment.train.global_batch)

    def import_feature(key, length):
      shape = [experiment.train.global_batch, length]
      self._placeholders[key] = tf1.placeholder(tf.int32, shape, name=key)
      return mtf.import_tf_tensor(mesh, self._placeholders[key], mtf.Shape(
          [batch_dim, mtf.Dimension("length", length)]))

    loss = mtf_model.build_loss(mtf, mtf_t, experiment, mesh, import_feature)
    return loss, {mesh: mtf_model.mesh_impl(mtf, experiment, topology)}

  def _analytic_link_bytes(self, graph, mesh_to_impl, experiment, topology):
    """Across islands, after the lowering: 2(K-1) times the bytes it all-reduced over
    them (islands.IslandPlacementMeshImpl counts them); None elsewhere."""
    del graph, experiment
    reduced = sum(getattr(impl, "reduced_bytes", 0) for impl in mesh_to_impl.values())
    return reduction.analytic_link_bytes(reduced, topology.islands) if reduced else None

  def step(self, batch: dict) -> float:
    feed = {self._placeholders[k]: batch[k] for k in self._placeholders}
    try:
      loss, _ = self._session.run([self._loss, self._train_op], feed_dict=feed)
    except self._tf.errors.OpError as e:
      lost = cluster.unreachable(self._workers, settle_s=LOST_WORKER_SETTLE_S)
      if lost:  # name the worker, not only the gRPC symptom
        raise RuntimeError(f"{', '.join(map(str, lost))} unreachable: "
                           f"{errors.one_line(e, limit=200)}") from e
      raise
    return float(loss)

  def trace_step(self, batch: dict, path: str) -> str:
    """One step (unmeasured) under TF's full trace: where each device's time went, as
    text; its Chrome trace is written to path."""
    from tf_tput.systems.tensorflow import trace as tf_trace
    tf1 = self._tf.compat.v1
    feed = {self._placeholders[k]: batch[k] for k in self._placeholders}
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    metadata = tf1.RunMetadata()
    start = time.perf_counter()
    self._session.run([self._loss, self._train_op], feed_dict=feed, options=options,
                      run_metadata=metadata)
    wall_s = time.perf_counter() - start
    tf_trace.write_chrome_trace(metadata.step_stats, path)
    return tf_trace.format_summary(tf_trace.summarize(metadata.step_stats), wall_s)

  def export_variables(self) -> dict:
    """Current trainable values by mtf variable name (as tf_tput.models names them)."""
    self._session.run(self._copy_slices_to_masters)
    values = self._session.run([master for _, _, master in self._masters])
    out = {}
    for (stacked_names, name, _), value in zip(self._masters, values, strict=True):
      out.update(zip(stacked_names, value, strict=True) if stacked_names else [(name, value)])
    return out

  def load_variables(self, values: dict) -> None:
    """Sets the trainable variables from {mtf variable name: numpy array} (every one,
    as export_variables gives them); the optimizer's slots are left as they are."""
    check_variable_names(self._loads, values)
    feed = {placeholder: values[name] for name, (placeholder, _) in self._loads.items()}
    self._session.run([assign for _, assign in self._loads.values()], feed_dict=feed)
    self._session.run(self._copy_masters_to_slices)

  def device_memory_bytes(self) -> Optional[int]:
    return tf_runtime.gpu_peak_bytes(self._tf, self._gpu_names)

  def close(self) -> None:
    if self._workers:  # a cluster's session may wait forever on a lost worker
      cluster.close_session(self._session, CLOSE_WAIT_S)
    else:
      self._session.close()
