"""Pathways §5.3 projected: what reducing gradients across islands over the data-centre
network (DCN) costs at the paper's scale, from the model's arithmetic and stated
assumptions (tf_tput.plan --islands prints it).

Per step each island sends its share of the hierarchical reduction
(runtime/islands.analytic_link_bytes: every island's gradient shards all-reduced
across the K islands) over its hosts' DCN links. That transfer can hide behind the
backward pass (about 2/3 of a step's compute) by the fraction `overlap`; what is left
is exposed, and the projected fraction of single-island throughput is
compute / (compute + exposed). The link efficiency (goodput over the nominal rate)
can be calibrated from a local sweep (suite islands_local): there the shaped link's
nominal rate and the time a step loses to it are both known.
"""

import dataclasses
import statistics
from typing import Optional

from tf_tput import models
from tf_tput.runtime import islands

BACKWARD_SHARE = 2 / 3  # of a step's matmul FLOPs: the two backward matmuls of three


@dataclasses.dataclass(frozen=True)
class Assumptions:
  hosts_per_island: int
  gbps_per_host: float         # each host's DCN bandwidth, sending
  link_efficiency: float       # achieved / nominal
  overlap: float               # fraction of the backward pass the transfer hides behind
  peak_flops_per_device: float
  mfu: float                   # of that peak, for the step's compute


def project(experiment, num_islands: int, devices_per_island: int,
            a: Assumptions) -> dict:
  """Bytes, seconds and the projected fraction of one step across islands."""
  m, d = experiment.model, experiment.data
  inputs = d.inputs_length if m.arch == "encoder_decoder" else 0
  tokens = experiment.train.global_batch * models.tokens_per_example(
      m, inputs, d.targets_length)
  gradient_bytes = models.num_params(m) * models.BYTES_PER_VARIABLE_ELEMENT
  total_bytes = islands.analytic_link_bytes(gradient_bytes, num_islands)
  sent_per_island = total_bytes / num_islands
  bandwidth = a.hosts_per_island * a.gbps_per_host * 1e9 / 8 * a.link_efficiency
  transfer_s = sent_per_island / bandwidth
  compute_s = (tokens * models.model_flops_per_token(m, inputs, d.targets_length)
               / (num_islands * devices_per_island * a.peak_flops_per_device * a.mfu))
  backward_s = BACKWARD_SHARE * compute_s
  exposed_s = max(0.0, transfer_s - a.overlap * backward_s)
  return {
      "islands": num_islands, "devices_per_island": devices_per_island,
      "tokens_per_step": tokens, "gradient_bytes": gradient_bytes,
      "bytes_per_reduction": total_bytes, "bytes_sent_per_island": sent_per_island,
      "island_dcn_bytes_per_s": bandwidth, "transfer_s": transfer_s,
      "compute_s": compute_s, "backward_s": backward_s, "exposed_s": exposed_s,
      "fraction_of_single_island": compute_s / (compute_s + exposed_s),
      "assumptions": dataclasses.asdict(a),
  }


def calibrate_efficiency(records: list) -> Optional[tuple]:
  """(median link efficiency, runs used) from island runs: for each run on a shaped
  link, the time its link should take (bytes sent per island x 8 / rate) over the
  step time it lost against the same run on an unshaped link. None without pairs."""
  ok = [r for r in records if r.get("islands", 1) > 1 and r["status"] == "ok"
        and r.get("link_bytes_per_step")]
  key = lambda r: (r["system"], r["model"], r["mesh_shape"], r["global_batch"],
                   r["targets_length"], r["islands"], r["num_processes"])
  unshaped = {key(r): r["step_time_s"]["median"] for r in ok
              if r["dcn_rate"] == islands.NO_LIMIT}
  ratios = []
  for r in ok:
    base = unshaped.get(key(r))
    if r["dcn_rate"] == islands.NO_LIMIT or base is None:
      continue
    lost_s = r["step_time_s"]["median"] - base
    ideal_s = r["link_bytes_per_step"] / r["islands"] * 8 / islands.parse_rate(r["dcn_rate"])
    if lost_s > 0:
      ratios.append(min(1.0, ideal_s / lost_s))
  return (statistics.median(ratios), len(ratios)) if ratios else None
