"""tf_tput/systems/jax/runtime.py's persistent compilation cache, in-process with
small jitted functions: the same program hits, another program misses, off is off."""

import numpy as np
import pytest

from tf_tput.systems.jax import runtime as jax_runtime


@pytest.fixture
def runtime():
  """A JaxRuntime; JAX's cache is off again afterwards, in-memory caches cleared."""
  import jax
  yield jax_runtime.JaxRuntime()
  from jax.experimental.compilation_cache import compilation_cache
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", None)
  jax.config.update("jax_enable_compilation_cache", True)  # JAX's default
  jax.clear_caches()


def _compile_afresh(runtime, directory, x):
  """Compiles one program as a new process would (nothing in memory), counted from a
  fresh compilation_cache(directory) call; what compilation_cache_hit() says then."""
  import jax
  import jax.numpy as jnp
  runtime.compilation_cache(directory)
  jax.clear_caches()
  jax.jit(lambda a: jnp.tanh(a) @ a.T)(x).block_until_ready()
  return runtime.compilation_cache_hit()


def test_the_same_program_hits_and_a_changed_one_misses(runtime, tmp_path):
  cache = str(tmp_path)
  x = np.ones((8, 8), np.float32)
  assert _compile_afresh(runtime, cache, x) is False      # cold: compiled, written
  assert _compile_afresh(runtime, cache, x) is True       # the same program: loaded
  assert _compile_afresh(runtime, cache, np.ones((8, 16), np.float32)) is False  # shape
  assert _compile_afresh(runtime, cache, x.astype(np.float16)) is False          # dtype
  assert _compile_afresh(runtime, cache, x.astype(np.float16)) is True
  [subdirectory] = tmp_path.iterdir()   # the runtime's own, per version and CPU
  assert subdirectory.name.startswith("jax-") and any(subdirectory.iterdir())


def test_off_asks_no_cache(runtime, tmp_path):
  assert _compile_afresh(runtime, None, np.ones((4, 4), np.float32)) is None
  assert runtime.compilation_cache_hit() is None


def test_each_cpu_keeps_its_own_subdirectory():
  """XLA:CPU compiles for the host's instructions; JAX's key names only "cpu"."""
  one = jax_runtime.cache_subdirectory("0.10.2", "AMD EPYC 7B13", {"avx2", "fma"})
  assert one == jax_runtime.cache_subdirectory("0.10.2", "AMD EPYC 7B13", {"fma", "avx2"})
  assert one != jax_runtime.cache_subdirectory("0.10.2", "AMD EPYC 7B13", {"avx2"})
  assert one != jax_runtime.cache_subdirectory("0.10.3", "AMD EPYC 7B13", {"avx2", "fma"})
  assert one.startswith("jax-0.10.2-AMD-EPYC-7B13-") and "/" not in one
