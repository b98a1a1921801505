"""torch.compile's persistent cache under --compilation_cache_dir (torch_runtime):
a graph compiled once is loaded the next time, and records say which."""

import pytest

torch = pytest.importorskip("torch")

from tf_tput.systems.torch import runtime as torch_runtime  # noqa: E402


def _compile_and_run(function) -> None:
  import torch._dynamo
  torch._dynamo.reset()  # forget compiled code in memory: the next compile asks the cache
  torch.compile(function)(torch.ones(8, 8))


def _matrix_square(x):
  # Inductor calls ATen's matmul for it and builds no C++ kernel (10 s on 2 cores);
  # its graph is cached all the same.
  return x @ x


@pytest.fixture
def runtime(monkeypatch):
  """A runtime whose cache settings are undone afterwards (they are process-wide)."""
  import torch._functorch.config as autograd_config
  import torch._inductor.config as inductor_config
  monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
  saved = inductor_config.fx_graph_cache, autograd_config.enable_autograd_cache
  yield torch_runtime.TorchRuntime()
  inductor_config.fx_graph_cache, autograd_config.enable_autograd_cache = saved


def test_a_graph_compiled_once_is_a_hit_the_next_time_and_off_asks_no_cache(
    runtime, tmp_path):
  runtime.compilation_cache(str(tmp_path))
  assert runtime.compilation_cache_hit() is None  # nothing compiled yet (eager runs)
  _compile_and_run(_matrix_square)
  assert runtime.compilation_cache_hit() is False
  kept = list(tmp_path.glob("torch-*/fxgraph/*"))
  assert kept, f"nothing written under {tmp_path}"
  # The subdirectory names the torch version and this CPU, as jax's does.
  assert kept[0].relative_to(tmp_path).parts[0].startswith(
      "torch-" + torch.__version__.replace("+", "-"))

  runtime.compilation_cache(str(tmp_path))
  _compile_and_run(_matrix_square)
  assert runtime.compilation_cache_hit() is True

  runtime.compilation_cache(None)
  _compile_and_run(_matrix_square)
  assert runtime.compilation_cache_hit() is None
