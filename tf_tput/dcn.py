"""Pathways §5.3 projected: what reducing gradients across islands over the data-centre
network (DCN) costs at the paper's scale, from the model's arithmetic and stated
assumptions (tf_tput.plan --islands prints it).

Per step each island sends its share of the hierarchical reduction
(reduction.analytic_link_bytes: every island's gradient shards all-reduced
across the K islands) over its hosts' DCN links. That transfer can hide behind the
backward pass (about 2/3 of a step's compute) by the fraction `overlap`; what is left
is exposed, and the projected fraction of single-island throughput is
compute / (compute + exposed). The link efficiency (goodput over the nominal rate)
can be calibrated from a local sweep (suite islands_local): there the shaped link's
nominal rate and the time a step loses to it are both known. A pipeline across
islands (project_pipeline) sends only its stage boundaries' activations instead.
"""

import dataclasses
import statistics
from typing import Optional

from tf_tput import models, reduction
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
  total_bytes = reduction.analytic_link_bytes(gradient_bytes, num_islands)
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


def project_pipeline(experiment, num_islands: int, devices_per_island: int,
                     a: Assumptions) -> dict:
  """A pipeline whose S stages split across the islands (S/K each, as tf_tput.launch
  --islands places them): bytes, seconds and the projected fraction of one step.

  Only the K-1 stage boundaries on the links cross, each sending every micro-batch's
  activations forward and their gradient back (GPipe's 2M transfers of one
  micro-batch, in the activation dtype) through the boundary stage's hosts; and the
  shared embedding's float32 gradient, summed between the first and last stages
  once per step (sent once each way). A transfer overlaps the next micro-batch's
  compute, so each boundary adds its transfer time to the schedule's fill (forward)
  and drain (backward) once, plus whatever a transfer takes beyond its slot (a
  micro-batch's forward or backward on one stage: 1/3 and 2/3 of the step's compute
  over its M+S-1 slots); the embedding's exchange at the step's end hides behind
  nothing (`overlap` applies to the data-parallel reduction only)."""
  m, d, p = experiment.model, experiment.data, experiment.pipeline
  S, M, K = p.stages, p.micro_batches, num_islands
  tokens = experiment.train.global_batch * d.targets_length
  micro_bytes = (experiment.train.global_batch // M * d.targets_length * m.d_model
                 * models.activation_bytes_per_element(m.activation_dtype))
  embedding_bytes = (models.padded_vocab(m.vocab_size) * m.d_model
                     * models.BYTES_PER_VARIABLE_ELEMENT)
  hosts_per_stage = max(1.0, a.hosts_per_island * K / S)
  bandwidth = hosts_per_stage * a.gbps_per_host * 1e9 / 8 * a.link_efficiency
  micro_s = micro_bytes / bandwidth
  compute_s = (tokens * models.model_flops_per_token(m, 0, d.targets_length)
               / (K * devices_per_island * a.peak_flops_per_device * a.mfu))
  slot_s = compute_s / (M + S - 1)
  behind_s = M * (max(0.0, micro_s - slot_s / 3) + max(0.0, micro_s - 2 * slot_s / 3))
  embedding_s = embedding_bytes / bandwidth
  exposed_s = (K - 1) * (2 * micro_s + behind_s) + embedding_s
  return {
      "islands": K, "devices_per_island": devices_per_island, "stages": S,
      "micro_batches": M, "tokens_per_step": tokens,
      "boundaries_on_links": K - 1, "micro_batch_bytes": micro_bytes,
      "bytes_per_step": (K - 1) * 2 * M * micro_bytes + 2 * embedding_bytes,
      "stage_dcn_bytes_per_s": bandwidth, "micro_batch_transfer_s": micro_s,
      "compute_s": compute_s, "slot_s": slot_s, "embedding_s": embedding_s,
      "exposed_s": exposed_s,
      "fraction_of_single_island": compute_s / (compute_s + exposed_s),
      "assumptions": dataclasses.asdict(a),
  }


def calibrate_efficiency(records: list) -> Optional[tuple]:
  """(median link efficiency, runs used) from data-parallel island runs: for each run
  on a shaped link, the time its link should take (bytes sent per island x 8 / rate)
  over the step time it lost against the same run on an unshaped link. None without
  pairs. Pipelined runs are left out: their transfers overlap compute, so the time
  they lose does not time the link."""
  ok = [r for r in records if r.get("islands", 1) > 1 and r["status"] == "ok"
        and r.get("link_bytes_per_step") and (r.get("pipeline_stages") or 1) == 1]
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
