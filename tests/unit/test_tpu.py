"""--strategy=tpu up to the connection: flags, resolver, device assignment, mesh impl.

No TPU here: the slice's topology is constructed (a v3-8's shape), not read from a TPU.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from tf_tput import config, systems
from tf_tput.records import provenance
from tf_tput.runtime import topology, tpu
from tf_tput.errors import UsageError
from tf_tput.systems.tensorflow import tpu as tf_tpu
from tf_tput.systems.tensorflow.mtf import model as mtf_model

tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("args, expect", [
    ((None, None, None), "--strategy=tpu needs --tpu"),
    (("grpc://10.0.0.2", None, None), "is not grpc://HOST:PORT"),
    (("grpc://10.0.0.2:8470", "us-central1-a", None), "is an address already"),
])
def test_bad_tpu_flags_are_refused(args, expect):
  with pytest.raises(UsageError, match=expect):
    tpu.address_from_flags(*args)


def test_good_tpu_flags_name_the_tpu():
  assert tpu.address_from_flags("my-tpu", "us-central1-a", "proj") == tpu.TpuAddress(
      "my-tpu", "us-central1-a", "proj")
  assert tpu.address_from_flags("local", None, None).name == "local"


def test_a_tpu_address_resolves_to_its_master_and_cluster():
  resolver = tf_tpu.cluster_resolver(tpu.TpuAddress("grpc://10.0.0.2:8470"))
  assert isinstance(resolver, tf.distribute.cluster_resolver.TPUClusterResolver)
  assert resolver.master() == "grpc://10.0.0.2:8470"
  assert resolver.cluster_spec().as_dict() == {"worker": ["10.0.0.2:8470"]}
  config_proto = tf_tpu.session_config(tf, resolver)
  assert config_proto.isolate_session_state
  assert [job.name for job in config_proto.cluster_def.job] == ["worker"]
  assert tf_tpu.accelerator_kind(resolver).startswith("TPU (type unknown")
  assert tf_tpu.nodes(resolver, resolver.master()) == ("10.0.0.2",)


def test_a_tpu_without_a_cluster_is_at_its_master_else_on_this_machine():
  class NoApi:  # a resolver whose Cloud TPU API does not answer
    task_type = "worker"

    def cluster_spec(self):
      raise RuntimeError("no API")
  assert tf_tpu.nodes(NoApi(), "grpc://10.0.0.3:8470") == ("10.0.0.3",)
  assert tf_tpu.nodes(NoApi(), "") == (provenance.this_node(),)  # a TPU VM's own


def _v3_8():
  """A v3-8's topology as initialize_system reports it: 2x2 chips, 2 cores each."""
  coordinates = [[x, y, 0, core] for y in range(2) for x in range(2) for core in range(2)]
  return tf.tpu.experimental.Topology(mesh_shape=[2, 2, 1, 2],
                                      device_coordinates=np.array([coordinates]))


def test_the_device_assignment_puts_one_replica_on_each_core():
  assignment = tf_tpu.device_assignment(tf, _v3_8(), 8)
  assert assignment.num_replicas == 8 and assignment.num_cores_per_replica == 1
  cores = {tuple(assignment.coordinates(r, 0)) for r in range(8)}
  assert len(cores) == 8
  assert {assignment.tpu_device(replica=r) for r in range(8)} == {
      f"/task:0/device:TPU:{i}" for i in range(8)}
  with pytest.raises(UsageError, match="needs 16 TPU cores but the slice has 8"):
    tf_tpu.device_assignment(tf, _v3_8(), 16)


def _experiment(mesh_shape: str):
  return config.load_experiment(["gin/models/t5_tiny.gin"], [
      f"MeshConfig.mesh_shape = '{mesh_shape}'",
      "MeshConfig.layout = 'batch:batch;d_ff:model;heads:model;vocab:model'"])


def test_tpus_get_the_simd_mesh_implementation_other_devices_the_placement_one():
  from tf_tput import compat
  mtf, _ = compat.import_mtf()
  if not flags.FLAGS.is_parsed():  # mtf's 4-D -> 3-D physical shape reads --fold_xy
    flags.FLAGS.mark_as_parsed()
  experiment = _experiment("batch:4;model:2")
  assignment = tf_tpu.device_assignment(tf, _v3_8(), 8)
  on_tpu = topology.Topology("tf", "tpu", tuple(f"tpu{i}" for i in range(8)), "TPU v3",
                             strategy="tpu", handles={"device_assignment": assignment})
  impl = mtf_model.mesh_impl(mtf, experiment, on_tpu)
  assert isinstance(impl, mtf.simd_mesh_impl.SimdMeshImpl)
  assert impl.shape.to_integer_list == [4, 2] and impl.device_assignment is assignment
  on_cpu = topology.Topology("tf", "cpu", tuple(f"/device:CPU:{i}" for i in range(8)),
                             "cpu")
  impl = mtf_model.mesh_impl(mtf, experiment, on_cpu)
  assert isinstance(impl, mtf.placement_mesh_impl.PlacementMeshImpl)
  assert impl.devices == list(on_cpu.devices)


def _v3_8_simd_impl(mesh_shape: str, layout: str):
  """mtf's SimdMeshImpl for this mesh on the constructed v3-8, as mtf_model builds it."""
  from tf_tput import compat
  mtf, _ = compat.import_mtf()
  if not flags.FLAGS.is_parsed():  # mtf's 4-D -> 3-D physical shape reads --fold_xy
    flags.FLAGS.mark_as_parsed()
  experiment = config.load_experiment(["gin/models/t5_tiny.gin"], [
      f"MeshConfig.mesh_shape = '{mesh_shape}'", f"MeshConfig.layout = '{layout}'"])
  on_tpu = topology.Topology("tf", "tpu", tuple(f"tpu{i}" for i in range(8)), "TPU v3",
                             strategy="tpu",
                             handles={"device_assignment": tf_tpu.device_assignment(
                                 tf, _v3_8(), 8)})
  return mtf, experiment, on_tpu, mtf_model.mesh_impl(mtf, experiment, on_tpu)


LAYOUT = "batch:batch;d_ff:model;heads:model;vocab:model"


@pytest.mark.parametrize("mesh_shape, layout", [
    ("batch:4;model:2", LAYOUT),
    ("batch:2;model:4", LAYOUT),
    ("batch:8", LAYOUT),
    ("model:2;batch:4", LAYOUT),          # batch on the second mesh axis
    ("model:8", "d_ff:model"),            # batch on no axis: every replica whole
])
@pytest.mark.parametrize("order", ["v3-8", "reversed"])
def test_replica_slices_are_mtf_simd_slicing(mesh_shape, layout, order):
  from tf_tput.systems.tensorflow.mtf import tpu as mtf_tpu
  mtf, experiment, _, impl = _v3_8_simd_impl(mesh_shape, layout)
  logical_to_physical = [impl.l2p(p) for p in range(8)]
  if order == "reversed":  # any permutation: the slice follows the replica's pnum
    logical_to_physical = logical_to_physical[::-1]
    impl = mtf.simd_mesh_impl.SimdMeshImpl(impl.shape, impl.layout_rules,
                                           logical_to_physical=logical_to_physical)
  dims = (("batch", 8), ("length", 16))
  shape, begins = mtf_tpu.replica_slices(experiment.mesh_shape, experiment.layout,
                                         logical_to_physical, dims)
  mtf_shape = mtf.Shape([mtf.Dimension(n, s) for n, s in dims])
  assert list(shape) == impl.slice_shape(mtf_shape)
  # Replica r computes logical processor p2l(r) (SimdMeshImpl's pnum_tensor).
  assert [list(b) for b in begins] == [impl.slice_begin(mtf_shape, impl.p2l(r))
                                       for r in range(8)]
  split = experiment.mesh_shape.get("batch", 1)
  assert shape == (8 // split, 16)
  assert sorted({b[0] for b in begins}) == list(range(0, 8, 8 // split))


def test_the_v3_8_order_is_not_the_listing_order():
  # Otherwise the slicing test above could pass with replicas in mesh order.
  _, _, _, impl = _v3_8_simd_impl("batch:4;model:2", LAYOUT)
  assert [impl.l2p(p) for p in range(8)] != list(range(8))


def test_each_replica_is_fed_only_its_batch_slice():
  """The TPU trainer's graph (built on the CPU: tpu.replicate needs the assignment,
  not the TPU): one placeholder per distinct slice, wired to the replicas that hold it."""
  from tf_tput.systems.tensorflow.mtf import tpu as mtf_tpu
  _, experiment, on_tpu, impl = _v3_8_simd_impl("batch:4;model:2", LAYOUT)
  built = mtf_tpu.build_graph(experiment, on_tpu)
  batch, length = experiment.train.global_batch, experiment.data.targets_length
  _, begins = mtf_tpu.replica_slices(experiment.mesh_shape, experiment.layout,
                                     [impl.l2p(p) for p in range(8)],
                                     (("batch", batch), ("length", length)))
  assert len(built.feeds) == 2 * 4  # inputs, targets x 4 batch slices
  assert all(f.placeholder.shape.as_list() == [batch // 4, length] for f in built.feeds)
  assert [[f.begin for f in mine] for mine in built.replica_feeds] == [[b, b] for b in begins]
  # tpu.replicate's per-replica inputs are exactly those placeholders, in replica order.
  replicated = [op for op in built.graph.get_operations() if op.type == "TPUReplicatedInput"
                and op.inputs[0].op.type == "Placeholder"]
  wired = sorted([i.op.name for i in op.inputs] for op in replicated)
  assert wired == sorted([mine[k].placeholder.op.name for mine in built.replica_feeds]
                         for k in range(2))
  rows = np.arange(batch)[:, None] * np.ones((1, length), np.int32)
  fed = built.feed_dict({"inputs": rows, "targets": rows + 100})
  for f in built.feeds:
    expected = rows[f.begin[0]:f.begin[0] + batch // 4]
    assert (fed[f.placeholder] == (expected + (100 if f.feature == "targets" else 0))).all()


@pytest.mark.parametrize("tpu_type,kind,peak_key", [
    ("v3", "TPU v3", "tpu_v3"), ("v3-32", "TPU v3", "tpu_v3"), ("V4", "TPU v4", "tpu_v4"),
    ("v5e", "TPU v5e", "tpu_v5e"), ("v5p-128", "TPU v5p", "tpu_v5p")])
def test_tpu_type_gives_a_kind_the_peak_table_knows(tpu_type, kind, peak_key):
  from tf_tput.measure import peak
  assert tpu.kind_from_type(tpu_type) == kind
  assert peak.table_peak(kind, "bfloat16") == (
      peak.PEAK_FLOPS[(peak_key, "bfloat16")], f"table:{peak_key}:bfloat16")


@pytest.mark.parametrize("tpu_type", ["v9", "h100", "tpu", ""])
def test_an_unknown_tpu_type_names_the_known_ones(tpu_type):
  with pytest.raises(UsageError, match=r"--tpu_type=.* use one of v2, v3, v4, v5e, v5p"):
    tpu.kind_from_type(tpu_type)


def test_without_an_api_answer_the_kind_is_unknown_and_gets_no_peak():
  from tf_tput.measure import peak
  kind = tf_tpu.accelerator_kind(object())  # a resolver with no Cloud TPU client
  assert kind.startswith("TPU (type unknown")
  assert peak.table_peak(kind, "bfloat16")[0] is None  # hence --tpu_type



def test_tf2_goes_to_a_tpu_through_tpustrategy_checked_before_tf_starts():
  """Up to the resolver: the strategy check takes tf2 on a TPU in bfloat16 and refuses
  float32 in one line; tf2 is a program TPUStrategy runs (topology's every_worker)."""
  bf16 = config.load_experiment(["gin/models/t5_tiny.gin"],
                                ["ModelConfig.activation_dtype = 'bfloat16'"])
  systems.check_strategy("tf2", "tpu", bf16)
  with pytest.raises(UsageError, match="--strategy=tpu trains in bfloat16"):
    systems.check_strategy("tf2", "tpu", config.load_experiment(["gin/models/t5_tiny.gin"]))
  tf2 = systems.load("tf2")
  assert tf2.every_worker and "tpu" in tf2.strategies


@pytest.mark.skipif(not os.path.exists("/dev/accel0") and "TPU_NAME" not in os.environ,
                    reason="no TPU here (no /dev/accel0, no TPU_NAME)")
def test_tf2_trains_on_the_tpu_of_this_host(tmp_path):
  out = tmp_path / "runs.jsonl"
  proc = subprocess.run(
      [sys.executable, "-m", "tf_tput.train", "--system=tf2", "--strategy=tpu",
       f"--tpu={os.environ.get('TPU_NAME', 'local')}", "--gin_file=gin/models/t5_tiny.gin",
       "--gin_param=ModelConfig.activation_dtype = 'bfloat16'", "--steps=2",
       "--warmup_steps=1", f"--results={out}"], capture_output=True, text=True,
      timeout=900, cwd=pathlib.Path(__file__).resolve().parents[2])
  assert proc.returncode == 0, proc.stderr[-3000:]
