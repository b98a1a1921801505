"""--system=torch's trainer: torch_model's loss and Adafactor on one device, data
parallel over torch.distributed processes.

Every process holds all the parameters (float32, named as tf_tput.models.variables)
and receives the same global numpy batch; rank r of N computes the contiguous rows
[r * B / N, (r + 1) * B / N) with the global batch's loss denominator, so the sum of
the ranks' losses is mtf's loss on the global batch and the sum of their gradients
its gradient. One all-reduce (sum) per step carries every gradient and the loss in
one flat float32 buffer; each rank then applies the same Adafactor update. The
caller initializes torch.distributed when world_size > 1 (runtime.py
under tf_tput.launch, or a Ray actor).

Eager by default; compile=True runs the loss (its forward and backward, through
AOTAutograd) and the Adafactor update under torch.compile, which compiles at the
first step (a warmup step) and needs a C++ compiler.
"""

import functools
from typing import Optional

import numpy as np

from tf_tput import models, reduction
from tf_tput import systems
from tf_tput.numerics import check_variable_names


def all_reduce_link_bytes(experiment, member_islands: list) -> int:
  """Bytes one step's all-reduce sends between islands: gloo's ring over the ranks,
  rank r in island member_islands[r], its one buffer every gradient and the loss in
  float32 (_all_reduce). With one rank per island that is
  reduction.analytic_link_bytes; with more, the flat ring's edges between
  islands each carry their share (ring_bytes_between), which no hierarchical
  reduction here shortens."""
  buffer = (models.num_params(experiment.model) + 1) * models.BYTES_PER_VARIABLE_ELEMENT
  return reduction.ring_bytes_between(buffer, member_islands)


class TorchTrainer(systems.Trainer):
  """The parameters and Adafactor state on `device`; step() runs one update."""

  def __init__(self, experiment, device: str = "cpu", rank: int = 0, world_size: int = 1,
               compile: bool = False):  # pylint: disable=redefined-builtin
    import torch
    from tf_tput.systems.torch import gemm as torch_gemm
    from tf_tput.systems.torch import model as torch_model

    self._torch = torch
    m = experiment.model
    global_batch = experiment.train.global_batch
    if global_batch % world_size:
      raise ValueError(f"global batch {global_batch} does not split over {world_size} "
                       "processes")
    self._device = torch.device(device)
    if self._device.type == "cpu":
      torch_gemm.select()  # the GEMM path gemm.choose set in the environment
    self._rank, self._world_size = rank, world_size
    rows = global_batch // world_size
    self._rows = slice(rank * rows, (rank + 1) * rows)
    self._names = [v.name for v in models.variables(m)]
    self._params = torch_model.init_params(m, experiment.train.seed, self._device)
    for value in self._params.values():
      value.requires_grad_(True)
    self.num_params = sum(value.numel() for value in self._params.values())
    self._optimizer = torch_model.Adafactor(self._params, m.activation_dtype)
    self._loss = functools.partial(torch_model.loss_fn, m=m)
    self._update = self._optimizer.update
    if compile:
      torch_model.mark_compile_constants()
      self._loss = torch.compile(self._loss)
      self._update = torch.compile(self._update)

  def _local_batch(self, batch: dict) -> dict:
    """This rank's rows of the global numpy batch, on its device."""
    return {key: self._torch.from_numpy(np.ascontiguousarray(value[self._rows])).to(
        self._device, non_blocking=True) for key, value in batch.items()}

  def _all_reduce(self, grads: list, loss):
    """Sums every rank's gradients and loss, in one collective over one flat buffer."""
    torch = self._torch
    flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
    torch.distributed.all_reduce(flat)
    out, offset = [], 0
    for g in grads:
      out.append(flat[offset:offset + g.numel()].view_as(g))
      offset += g.numel()
    return out, flat[-1]

  def step(self, batch: dict) -> float:
    """One Adafactor update on the global batch; its loss (every rank's summed)."""
    params = [self._params[name] for name in self._names]
    denominator = int(np.prod(batch["targets"].shape))  # the global batch's
    loss = self._loss(self._params, self._local_batch(batch), denominator=denominator)
    grads = self._torch.autograd.grad(loss, params)
    if self._world_size > 1:
      grads, loss = self._all_reduce(grads, loss)
    self._update(self._params, dict(zip(self._names, grads, strict=True)))
    return float(loss.detach())

  def load_variables(self, values: dict) -> None:
    """Replaces the parameters (e.g. the TF baseline's initial values) and resets Adafactor."""
    check_variable_names(self._names, values)
    for name in self._names:
      if tuple(np.shape(values[name])) != tuple(self._params[name].shape):
        raise ValueError(f"{name} has shape {np.shape(values[name])}, the model's "
                         f"{tuple(self._params[name].shape)}")
    with self._torch.no_grad():
      for name in self._names:
        self._params[name].copy_(self._torch.from_numpy(np.array(values[name], np.float32)))
    self._optimizer.reset()

  def export_variables(self) -> dict:
    return {name: value.detach().cpu().numpy().copy()
            for name, value in self._params.items()}

  def device_memory_bytes(self) -> Optional[int]:
    if self._device.type == "cuda":
      return int(self._torch.cuda.max_memory_allocated(self._device))
    return None

  def close(self) -> None:
    self._params = self._optimizer = self._loss = self._update = None
