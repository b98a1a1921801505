"""Makes mesh-tensorflow 0.1.21 (its last release) import on the TensorFlow setup.py
allows (2.16 to 2.21).

mesh-tensorflow was written against TF 1.x / early 2.x. Four names it needs at import
time are gone from current TensorFlow (see docs/design.md, "Facts about the
dependencies"), and one from current setuptools; this package provides them before
mtf is imported:

* ``tensorflow.compat.v1.estimator`` (and ``tf.estimator`` for ``gin.tf``): mtf uses
  only ``ModeKeys``, ``SessionRunHook`` and ``CheckpointSaverListener`` from it, as
  base classes and constants. They are re-created in :mod:`tf_tput.compat.estimator`
  with the estimator's own values and method signatures.
* ``ops.register_tensor_conversion_function``: moved to
  ``tensorflow.python.framework.tensor_conversion_registry``; aliased back.
* ``pkg_resources``: ``mesh_tensorflow.transformer.utils`` imports it to find its
  ``defaults.gin``; setuptools >= 81 no longer ships it (tensorboard's and ray's
  dependencies pull such a setuptools). Where it is missing, a module with just
  ``resource_filename`` (built on importlib) stands in.
* ``tensorflow.python.tpu.tpu_config`` / ``tpu_estimator``: imported by
  ``mesh_tensorflow.transformer.utils`` for its TPUEstimator runner, which tf_tput
  does not use. They are provided as modules whose every attribute raises, so a
  caller that reaches them learns why instead of seeing a half-working object.

Everything else mtf needs (``tf.compat.v1`` graph mode, variable scopes, collectives
through PlacementMeshImpl) still exists in TensorFlow 2.21 and is used as is.
"""

import importlib.util
import os
import sys
import types


def _unavailable_module(name: str) -> types.ModuleType:
  module = types.ModuleType(name)

  def __getattr__(attr):  # noqa: N807 (module-level __getattr__, PEP 562)
    if attr.startswith("__"):
      raise AttributeError(attr)
    raise ImportError(
        f"{name}.{attr} was removed from TensorFlow; tf_tput drives mesh_tensorflow "
        "through tf.compat.v1 Sessions, not TPUEstimator")

  module.__getattr__ = __getattr__
  return module


def _pkg_resources_stand_in() -> types.ModuleType:
  module = types.ModuleType("pkg_resources")

  def resource_filename(package_or_module: str, resource_name: str) -> str:
    """The file `resource_name` beside the package or module, as pkg_resources gives."""
    spec = importlib.util.find_spec(package_or_module)
    base = (spec.submodule_search_locations[0] if spec.submodule_search_locations
            else os.path.dirname(spec.origin))
    return os.path.join(base, resource_name)

  module.resource_filename = resource_filename
  return module


def apply() -> None:
  """Installs the missing names; call before importing mesh_tensorflow.

  Idempotent, and checks each name every time: TensorFlow's lazy module wrappers can
  drop an attribute set on tf.compat.v1 when other modules load later.
  """
  import tensorflow as tf
  from tensorflow.python.framework import ops
  from tensorflow.python.framework import tensor_conversion_registry

  from tf_tput.compat import estimator

  for module in (tf.compat.v1, tf):
    if not hasattr(module, "estimator"):
      module.estimator = estimator
  sys.modules.setdefault("tensorflow.compat.v1.estimator", estimator)

  try:
    import pkg_resources  # noqa: F401
  except ImportError:
    sys.modules["pkg_resources"] = _pkg_resources_stand_in()

  if not hasattr(ops, "register_tensor_conversion_function"):
    ops.register_tensor_conversion_function = (
        tensor_conversion_registry.register_tensor_conversion_function)

  import tensorflow.python.tpu as tf_tpu
  for name in ("tpu_config", "tpu_estimator"):
    full_name = f"tensorflow.python.tpu.{name}"
    if full_name not in sys.modules:
      try:
        __import__(full_name)
      except ImportError:
        sys.modules[full_name] = _unavailable_module(full_name)
        setattr(tf_tpu, name, sys.modules[full_name])


def import_mtf():
  """Returns (mesh_tensorflow, mesh_tensorflow.transformer), importable on TF 2.21."""
  apply()
  import mesh_tensorflow as mtf
  import mesh_tensorflow.transformer as mtf_transformer
  return mtf, mtf_transformer
