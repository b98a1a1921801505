"""Hugging Face transformers' T5 in PyTorch through tf_tput's measured loop: the
reference `--system=torch` is compared with (docs/systems.md, "torch").

    pip install -e ".[compare]"   # transformers
    python scripts/hf_t5_reference.py --gin_file=t5_small --global_batch=8 --steps=10

The model is T5ForConditionalGeneration sized from the same gin ModelConfig (T5 v1.0:
ReLU feed-forward, no biases, one shared embedding, the padded vocabulary) with
transformers' Adafactor at mtf's defaults (relative step, parameter scale, no
momentum); the batches are tf_tput's (tf_tput.data) and the clock is the shared loop
(tf_tput.measure.loop), so the tokens/s are counted as every system's are. It is not
the same function as tf_tput's systems (Hugging Face's own layers, initializers and
loss), so it is a reference for speed only, never a parity partner. Embeddings are
row lookups (nn.Embedding), as `ModelConfig.embedding = 'gather'` computes them.
Not a system of the suite and not run by the tests: it needs transformers, which no
other part of tf_tput does.
"""

import sys

from absl import app
from absl import flags

from tf_tput import config, data, errors, models
from tf_tput.errors import UsageError
from tf_tput.measure import loop, metrics
from tf_tput.runtime import host_memory

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", ["t5_small"], "Gin file of an encoder-decoder model.")
flags.DEFINE_multi_string("gin_param", [], "Gin binding (repeatable).")
flags.DEFINE_integer("global_batch", 8, "Examples per step.")
flags.DEFINE_integer("steps", 10, "Measured steps.")
flags.DEFINE_integer("warmup_steps", 1, "Unmeasured first steps.")
flags.DEFINE_integer("threads", None, "torch.set_num_threads (unset: torch's default).")
flags.DEFINE_bool("keep_freed_memory", True, "As tf_tput.train's flag: keep freed host "
                  "memory for reuse, so the reference runs as the systems do.")


class HfT5Trainer:
  """The shared loop's Trainer interface over transformers' T5."""

  def __init__(self, m):
    import torch
    import transformers
    from transformers.optimization import Adafactor
    self._torch = torch
    hf_config = transformers.T5Config(
        vocab_size=models.padded_vocab(m.vocab_size), d_model=m.d_model, d_kv=m.d_kv,
        d_ff=m.d_ff, num_layers=m.num_layers, num_decoder_layers=m.num_layers,
        num_heads=m.num_heads, relative_attention_num_buckets=m.relative_attention_num_buckets,
        relative_attention_max_distance=128, dropout_rate=0.0, layer_norm_epsilon=1e-6,
        feed_forward_proj="relu", tie_word_embeddings=True, decoder_start_token_id=0,
        pad_token_id=0)
    torch.manual_seed(0)
    self._model = transformers.T5ForConditionalGeneration(hf_config).train()
    self.num_params = sum(p.numel() for p in self._model.parameters())
    self._optimizer = Adafactor(self._model.parameters(), lr=None, relative_step=True,
                                scale_parameter=True, warmup_init=False, beta1=None)

  def step(self, batch: dict) -> float:
    torch = self._torch
    inputs = torch.from_numpy(batch["inputs"]).long()
    labels = torch.from_numpy(batch["targets"]).long()
    loss = self._model(input_ids=inputs, attention_mask=(inputs != 0).long(),
                       labels=labels.masked_fill(labels == 0, -100)).loss
    loss.backward()
    self._optimizer.step()
    self._optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())

  def device_memory_bytes(self):
    return None

  def close(self) -> None:
    self._model = self._optimizer = None


def run() -> int:
  for name in ("global_batch", "steps", "warmup_steps", "threads"):
    if FLAGS[name].value is not None and FLAGS[name].value < 1:
      raise UsageError(f"--{name}={FLAGS[name].value}; it must be >= 1")
  bindings = list(FLAGS.gin_param) + [
      f"TrainConfig.global_batch = {FLAGS.global_batch}",
      f"TrainConfig.steps = {FLAGS.steps}", f"TrainConfig.warmup_steps = {FLAGS.warmup_steps}"]
  experiment = config.load_experiment(FLAGS.gin_file, bindings)
  m = experiment.model
  if m.arch != "encoder_decoder" or m.activation_dtype != "float32":
    raise UsageError(f"{m.name} ({m.arch}, {m.activation_dtype}): this reference is T5 "
                     "(encoder_decoder) in float32; pass a T5 gin file")
  try:
    import torch
    import transformers  # noqa: F401
  except ImportError as e:
    raise UsageError(f"{e.name} is not installed: pip install -e '.[compare]'") from None
  if FLAGS.threads:
    torch.set_num_threads(FLAGS.threads)
  allocator = (host_memory.keep_freed_memory() if FLAGS.keep_freed_memory
               else host_memory.state())
  trainer = HfT5Trainer(m)
  measurement = loop.run(trainer, data.batches(experiment), FLAGS.steps, FLAGS.warmup_steps)
  summary = metrics.summarize(measurement, experiment, 1, None)
  if measurement.error:
    print(f"error: {measurement.error}", file=sys.stderr)
    return 1
  print(f"hf_t5 {m.name} ({trainer.num_params:,} params), batch {FLAGS.global_batch}, "
        f"{torch.get_num_threads()} threads: tokens/s {summary['tokens_per_sec']:,.1f}, "
        f"step time median {summary['step_time_s']['median']:.4f}s, final loss "
        f"{measurement.losses[-1]:.4f}; allocator: {allocator}")
  return 0


def main(argv) -> int:
  return errors.run_entry_point(run, argv)


if __name__ == "__main__":
  app.run(main)
