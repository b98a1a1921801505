"""Which devices a run uses, per framework, and how fast their matmuls are.

Resolution happens once, before any model is built: `--num_cpu_devices=N` splits the
host CPU into N virtual devices (they share its cores); otherwise GPUs are used when
present, else the one CPU device.
"""

import dataclasses
import os
from typing import Callable, Optional

from tf_tput import provenance
from tf_tput.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Topology:
  framework: str             # "tf"
  platform: str              # "cpu" | "gpu"
  devices: tuple             # framework device names, in mesh order
  device_kind: str           # e.g. "NVIDIA H100 80GB HBM3", or the CPU model
  num_processes: int = 1

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  def describe(self) -> list:
    """The `accelerators` entry of a record's env."""
    return [{"platform": self.platform, "kind": self.device_kind,
             "count": self.num_devices}]


def resolve(framework: str, num_cpu_devices: Optional[int]) -> Topology:
  if framework == "tf":
    return _resolve_tf(num_cpu_devices)
  raise UsageError(f"no topology resolver for framework {framework!r}")


def _resolve_tf(num_cpu_devices: Optional[int]) -> Topology:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf

  cpu_kind = provenance.cpu_model()
  if num_cpu_devices:
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_cpu_devices)
    names = tuple(f"/device:CPU:{i}" for i in range(num_cpu_devices))
    return Topology("tf", "cpu", names, cpu_kind)
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    details = tf.config.experimental.get_device_details(gpus[0])
    names = tuple(f"/device:GPU:{i}" for i in range(len(gpus)))
    return Topology("tf", "gpu", names, details.get("device_name", "GPU"))
  return Topology("tf", "cpu", ("/device:CPU:0",), cpu_kind)


def matmul_runner(topology: Topology, n: int, dtype: str) -> Callable[[], None]:
  """A callable that runs one n x n x n matmul on the first device and waits for it."""
  if topology.framework != "tf":
    raise UsageError(f"no matmul probe for framework {topology.framework!r}")
  import tensorflow as tf

  with tf.device(topology.devices[0]):
    a = tf.random.normal([n, n], dtype=tf.float32)
    a = tf.cast(a, dtype)
    b = tf.identity(a)

  def run():
    with tf.device(topology.devices[0]):
      float(tf.cast(tf.matmul(a, b)[0, 0], tf.float32))  # reading a value waits
  return run
