"""The peaks MFU is against: MFU@best (every run on one machine and dtype against the
best peak measured there) and the console's footer listing each peak once."""

import textwrap

from tf_tput.measure import peak as peak_lib
from tf_tput.report import bands, footnotes

PEAKS_WIDTH = 100  # columns the peak footer wraps at


def _hardware(r: dict) -> tuple:
  """What makes two records the same machine for MFU@best: the CPU model, the
  accelerators' platform and kind, the devices per worker and the dtype. Never a
  worker's task or address: a cluster relaunched on other ports is the same machine."""
  accelerators = r["env"]["accelerators"] or []
  kinds = tuple(sorted({(a.get("platform"), a.get("kind")) for a in accelerators}))
  counts = tuple(sorted(a.get("count") or 0 for a in accelerators))
  return (r["env"]["cpu"], kinds, counts, r["num_devices"], r["dtype"])


def best_peaks(records: list) -> dict:
  """Per hardware and dtype, the highest whole-machine peak any ok record measured.

  Each system's MFU is against its own framework's matmul peak; MFU@best puts every
  system on the same machine and dtype against one peak, the best either reached.
  """
  best = {}
  for r in footnotes.ok_runs(records):
    if r["peak_flops_per_device"]:
      whole = r["peak_flops_per_device"] * r["num_devices"]
      best[_hardware(r)] = max(best.get(_hardware(r), 0), whole)
  return best


def mfu_at_best(r: dict, peaks: dict) -> str:
  """The MFU@best cell of a record, against best_peaks' `peaks`."""
  peak = peaks.get(_hardware(r))
  if not peak or not r["model_tflops_per_sec"]:
    return "-"
  return f"{100 * r['model_tflops_per_sec'] * 1e12 / peak:.1f}%"


def peak_lines(records: list) -> list:
  """The peaks records' MFU is against, each distinct one once: one bullet per probe
  or table entry (peak.source_kind: what was measured, where, shared by how many
  devices), the per-device range its runs got and which runs used it, wrapped for a
  terminal. Each record's peak_source keeps the whole text."""
  lines = []
  for kind, runs in sorted(bands.group(records, lambda r: peak_lib.source_kind(
      r["peak_source"])).items()):
    values = [r["peak_flops_per_device"] for r in runs if r["peak_flops_per_device"]]
    low, high = ((peak_lib.flops_label(min(values)), peak_lib.flops_label(max(values)))
                 if values else (None, None))
    if not values:
      got = "no peak"
    elif low == high:
      got = f"{low}/device"
    else:  # '59.8–93.4 GFLOP/s' where both have the same unit
      unit = high.split(" ")[1]
      got = f"{low.split(' ')[0] if low.endswith(unit) else low}–{high}/device"
    who = ", ".join(f"{system} {model} {mesh}" + (f" ×{len(same)}" if len(same) > 1 else "")
                    for (system, model, mesh), same in bands.group(
                        runs, lambda r: (r["system"], r["model"], r["mesh_shape"])).items())
    lines.append(textwrap.fill(f"- {kind}: {got}; {len(runs)} run(s): {who}",
                               PEAKS_WIDTH, subsequent_indent="    ",
                               break_on_hyphens=False))
  return lines
