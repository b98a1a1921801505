"""torch's GEMM paths on CPUs (tf_tput/measure/gemm.py chooses one per machine).

Every dense matmul of the model with a weight (the projections, the FFN, the
logits) goes through matmul() below, which runs the selected path; the attention's
batched einsums and the Adafactor update stay torch's own. All three paths compute
in float32 (or the activation dtype) with float32 accumulation: only the order of
the sums differs, which parity's tolerances admit.

* aten: torch's own matmul, through its BLAS (MKL's sgemm in the x86 wheels, which
  on AMD CPUs does not run its AVX-512 kernels);
* onednn: oneDNN's matmul (torch.ops.mkldnn._linear_pointwise, the op inductor's
  CPU fusions use), forward and both gradients;
* zentorch: AMD's ZenDNN (torch.ops.zentorch.zentorch_mm), where the zentorch
  package is installed (`pip install -e ".[zentorch]"`, x86 only) and the
  run names it (NAMED_ONLY below).

The path comes from the environment (PATH_ENV), which gemm.choose sets before the
trainer is built; select() reads it.
"""

import importlib.util
import os

import torch

PATH_ENV = "TF_TPUT_TORCH_GEMM"
DEFAULT = "aten"


def offered() -> tuple:
  """The paths this installation has: aten always; onednn where torch was built with
  it; zentorch where its package is installed."""
  out = [DEFAULT]
  if torch.backends.mkldnn.is_available():
    out.append("onednn")
  if importlib.util.find_spec("zentorch") is not None:
    out.append("zentorch")
  return tuple(out)


# Paths that run only where --gemm or PATH_ENV names them, never by the probe's
# choice (measure/gemm.py): on a 2-core Zen 3 EPYC zentorch's 2048 x 2048 probe came
# close to aten's or beat it (156 and 177 against 183 and 173 GFLOP/s alternating;
# 182 against 146 once) while T5 Small trained 1.14x slower on it (658 and 655
# against 749 and 752 tokens/s, alternating; docs/results/2026-12-07-cpu-table-epyc-
# zen3.md), each with its weight cache off (LIBRARY_ENV): one large matmul does not
# stand for the model's smaller ones.
NAMED_ONLY = ("zentorch",)

# Set by select() for its path. zentorch 2.13.0.2's mm caches its second operand
# reordered by writing the reorder into that tensor's own storage (b differs after
# zentorch_mm(a, b)): made for inference, it corrupts training's weights and
# gradients (t5_tiny's loss after 3 steps 6.72 and 6.74, against 5.71 on aten and
# onednn). Read at zentorch's first op.
LIBRARY_ENV = {"zentorch": {"ZENDNNL_MATMUL_WEIGHT_CACHE": "0"}}


def _onednn_mm(a, b):
  # _linear_pointwise(x, w) is x @ w.T; strided views are read as they are.
  return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")


def _zentorch_mm(a, b):
  import zentorch  # noqa: F401 - registers torch.ops.zentorch
  return torch.ops.zentorch.zentorch_mm(a, b)


MM = {"onednn": _onednn_mm, "zentorch": _zentorch_mm}


class _LibraryMatmul(torch.autograd.Function):
  """a [M, K] @ b [K, N] through a library's mm, and its gradients through the same:
  da = g @ b.T, db = a.T @ g."""

  @staticmethod
  def forward(ctx, a, b, mm):
    ctx.save_for_backward(a, b)
    ctx.mm = mm
    return mm(a, b)

  @staticmethod
  def backward(ctx, grad):
    a, b = ctx.saved_tensors
    grad_a = ctx.mm(grad, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = ctx.mm(a.t(), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b, None


_selected = [DEFAULT]


def unknown(name: str) -> str:
  """The error line for a path this installation does not have."""
  return (f"{PATH_ENV}={name}: this torch offers {', '.join(offered())}; name one of "
          "those or unset it")


def select(name: str = None) -> str:
  """Makes matmul() run `name` (default: $TF_TPUT_TORCH_GEMM, else aten); the name.
  Sets the path's LIBRARY_ENV in os.environ (children inherit it), over a value the
  user set: a training run must not take zentorch's weight cache. ValueError for a
  path this installation does not have."""
  name = name or os.environ.get(PATH_ENV) or DEFAULT
  if name not in offered():
    raise ValueError(unknown(name))
  os.environ.update(LIBRARY_ENV.get(name, {}))
  _selected[0] = name
  return name


def selected() -> str:
  return _selected[0]


def matmul(x, w):
  """x [..., K] @ w [K, N] through the selected path."""
  name = _selected[0]
  if name == DEFAULT:
    return x @ w
  rows = x.reshape(-1, x.shape[-1])
  out = _LibraryMatmul.apply(rows, w, MM[name])
  return out.reshape(*x.shape[:-1], w.shape[-1])
