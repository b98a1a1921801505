"""tf_tput/systems/jax/trainer.py's device_mesh: topology-aware on TPUs, in order elsewhere."""

import dataclasses

import numpy as np

from tf_tput.systems.jax import trainer as jax_trainer


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  """What mesh_utils reads of a device: its platform, kind and place in the torus."""
  id: int
  coords: tuple
  core_on_chip: int = 0
  platform: str = "tpu"
  device_kind: str = "TPU v4"
  process_index: int = 0
  slice_index: int = 0


def _v4_16(order):
  """A v4-16 slice (2x2x2 chips, one core each), listed in the given order."""
  chips = [(x, y, z) for z in range(2) for y in range(2) for x in range(2)]
  devices = [FakeDevice(i, c) for i, c in enumerate(chips)]
  return [devices[i] for i in order]


def test_on_tpus_the_inner_mesh_axis_spans_neighbouring_chips():
  scrambled = _v4_16((5, 0, 3, 6, 1, 7, 2, 4))
  mesh = jax_trainer.device_mesh((2, 4), scrambled)
  assert mesh.shape == (2, 4)
  # Each row (the 4-way inner axis) is one z-plane of the torus, whatever the listing.
  assert [{d.coords[2] for d in row} for row in mesh] == [{0}, {1}]
  assert sorted(d.id for d in mesh.flat) == list(range(8))
  assert [[d.id for d in row] for row in np.asarray(scrambled).reshape(2, 4)] != \
      [[d.id for d in row] for row in mesh]  # the plain order would differ


def test_elsewhere_the_listed_order_is_kept():
  cpus = [FakeDevice(i, (0, 0, 0), platform="cpu", device_kind="cpu") for i in range(8)]
  mesh = jax_trainer.device_mesh((2, 4), cpus)
  assert [[d.id for d in row] for row in mesh] == [[0, 1, 2, 3], [4, 5, 6, 7]]
