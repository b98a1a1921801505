"""The part of ``tf.estimator`` (removed in TF 2.16) that mesh_tensorflow imports.

Signatures and values follow tensorflow_estimator 2.15, so mtf's subclasses
(MtfRestoreHook, MtfCheckpointSaverListener) and gin.tf's GinConfigSaverHook behave as
they did there. tf_tput calls none of them in its own loop.
"""


class ModeKeys:
  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


class SessionRunHook:
  """Hook to extend calls to MonitoredSession.run()."""

  def begin(self):
    pass

  def after_create_session(self, session, coord):
    pass

  def before_run(self, run_context):
    return None

  def after_run(self, run_context, run_values):
    pass

  def end(self, session):
    pass


class CheckpointSaverListener:
  """Interface for listeners that take action before or after checkpoint save."""

  def begin(self):
    pass

  def before_save(self, session, global_step_value):
    pass

  def after_save(self, session, global_step_value):
    pass

  def end(self, session, global_step_value):
    pass
