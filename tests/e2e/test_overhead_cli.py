"""tf_tput.overhead end to end: both systems, both figures and the overhead each."""

import re

from cli_helpers import error_lines, run_cli


def test_overhead_prints_shared_and_bare_tokens_per_sec_for_each_system():
  # A one-layer decoder: the lines are under test, not the model (a second layer adds
  # ~4 s, an encoder-decoder about twice the CPU to build).
  proc = run_cli("tf_tput.overhead", "--systems=mtf,jax",
                 "--gin_file=gin/models/decoder_tiny.gin",
                 "--gin_param=ModelConfig.num_layers = 1",
                 "--steps=3", "--rounds=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for system in ("mtf", "jax"):
    line = re.search(rf"^{system}: shared loop ([\d,.]+) tokens/s, bare loop ([\d,.]+) "
                     r"tokens/s, overhead ([+-][\d.]+)% \(target <= 2%; "
                     r"rounds [+-][\d.]+% \.\. [+-][\d.]+%\); the loop's own cost "
                     r"-?[\d.]+ us/step = -?[\d.]+% of a step$", proc.stdout,
                     re.MULTILINE)
    assert line, proc.stdout
    shared, bare = (float(line.group(i).replace(",", "")) for i in (1, 2))
    assert shared > 0 and bare > 0
    assert abs(float(line.group(3)) - 100 * (1 - shared / bare)) < 0.02  # printed rounded


def test_overhead_rejects_zero_rounds():
  proc = run_cli("tf_tput.overhead", "--systems=jax", "--rounds=0")
  assert proc.returncode == 2
  assert error_lines(proc.stderr) == ["error: --rounds=0; it must be >= 1"]
