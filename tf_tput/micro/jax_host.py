"""One JAX host of the dispatch micro-benchmark (started by tf_tput.micro.jax_multi).

    python -m tf_tput.micro.jax_host --spec='{...}' --out=repeats.json [--bare]

--bare times the plainest loop of the same jitted call that does not deadlock (the
same bounded in-flight window; no barrier between repeats, one check at the end),
the reference the harness is compared with.
"""

import json
import time

from absl import flags

from tf_tput import entry, micro
from tf_tput.systems.jax import runtime as jax_runtime

FLAGS = flags.FLAGS
flags.DEFINE_string("spec", None, "micro.Spec as JSON.", required=True)
flags.DEFINE_string("out", None, "Where process 0 writes the repeat timings.",
                    required=True)
flags.DEFINE_bool("bare", False, "Time a bare loop of the jitted call: no barriers, "
                  "no per-repeat checks.")

# Calls dispatched before waiting for the last. XLA:CPU deadlocked here with 64
# unfinished psum calls queued even in one process (two device threads waiting in
# different calls' rendezvous); 32 and below ran, 8 keeps a margin.
IN_FLIGHT = 8


def _programs(spec: micro.Spec):
  """(one computation, chain_length fused computations, initial x, matmul input)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  mesh = Mesh(np.asarray(jax.devices()), ("devices",))
  n_devices = spec.num_devices

  def computation(x, a):
    if spec.matmul_n:
      # 1 for a full matmul of ones, 0 for a skipped or partial one (micro.__init__).
      x = x + (jnp.matmul(a[0], a[0])[0, 0] == spec.matmul_n).astype(jnp.int32)
    return jax.lax.psum(x, "devices") // n_devices + 1

  one = jax.shard_map(computation, mesh=mesh, in_specs=(P("devices"), P("devices")),
                      out_specs=P("devices"))
  fused = jax.jit(lambda x, a: jax.lax.fori_loop(
      0, spec.chain_length, lambda _, x: one(x, a), x), donate_argnums=0)
  sharding = NamedSharding(mesh, P("devices"))
  x = jax.make_array_from_callback((n_devices,), sharding,
                                   lambda index: np.zeros((n_devices,), np.int32)[index])
  n = max(spec.matmul_n, 1)
  filled = np.full((n_devices, n, n), micro.MATMUL_FILL, np.float32)
  a = jax.make_array_from_callback((n_devices, n, n), sharding, lambda index: filled[index])
  return jax.jit(one, donate_argnums=0), fused, x, a


def _value(x) -> int:
  return int(x.addressable_data(0)[0])


def run(spec: micro.Spec, *, out: str, bare: bool) -> int:
  """Times the spec's repeats on this host; process 0 writes them to `out`."""
  topo = jax_runtime.RUNTIME.resolve(spec.devices_per_host)
  import jax
  from jax.experimental import multihost_utils

  step, fused, x, a = _programs(spec)
  call = step if spec.mode == "opbyop" else fused
  per_call = 1 if spec.mode == "opbyop" else spec.chain_length
  done = 0
  seconds = []
  for repeat in range(spec.repeats + 1):  # repeat 0 warms up (compiles)
    if not bare:
      multihost_utils.sync_global_devices(f"repeat {repeat}")
    start = time.perf_counter()
    for index in range(spec.calls_per_repeat):
      x = call(x, a)
      if (index + 1) % IN_FLIGHT == 0:
        x.block_until_ready()
    x.block_until_ready()
    elapsed = time.perf_counter() - start
    done += spec.calls_per_repeat * per_call
    if not bare:
      micro.check(_value(x), micro.expected(spec, done),
                  f"jax {spec.mode} repeat {repeat}")
    if repeat:
      seconds.append(elapsed)
  micro.check(_value(x), micro.expected(spec, done), f"jax {spec.mode} after all repeats")
  if jax.process_index() == 0:
    with open(out, "w") as f:
      json.dump({"repeat_seconds": seconds, "devices": topo.num_devices}, f)
  return 0


def main(argv) -> int:
  del argv
  return run(micro.Spec(**json.loads(FLAGS.spec)), out=FLAGS.out, bare=FLAGS.bare)


if __name__ == "__main__":
  entry.start(main)
