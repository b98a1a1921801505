"""report.md's §5.3 table: runs across islands (tf_tput.launch --islands), each
against its one-island run and an ideal link, beside the paper's fraction."""

from tf_tput.report import bands, configs, published


def islands_table(records: list) -> tuple:
  """(header, rows): §5.3 as numbers. Runs under tf_tput.launch --islands grouped by model,
  devices, processes, global batch and length; one row per islands x link rate, per
  system its tokens/s and fraction of its one-island row, the link bytes per step,
  counted and analytic (each system's reduction sends its own), and the fraction an
  ideal link with no overlap would give (the unshaped islands run's step time plus the
  link's bytes at its rate: dcn.py's model at efficiency 1, overlap 0); and the paper's
  fraction for its models."""
  launched = [r for r in records if r.get("islands", 0) >= 1]  # under --islands=K
  names = configs.systems_in(launched)
  header = ["model", "pipeline", "devices", "processes", "islands x devices", "link rate"]
  for s in names:
    header += [f"{s} tokens/s [spread]", f"{s} of 1 island",
               f"{s} link bytes/step (counted)", f"{s} link bytes/step (analytic)",
               f"{s} ideal-link projection"]
  header += ["published fraction"]
  rows = []
  place = lambda r: (r["islands"], r.get("dcn_rate") or "loopback")
  for runs in bands.group(launched, lambda r: (r["model"], _pipeline(r), r["num_devices"],
                                               r["num_processes"], r["global_batch"],
                                               r["targets_length"])).values():
    medians = {}
    for (where, s), mine in bands.group(runs, lambda r: (place(r), r["system"])).items():
      ok = [r for r in mine if r["status"] == "ok"]
      if ok:
        medians[(where, s)] = (bands.tokens_band(ok), ok[-1])
    for where, mine in bands.group(runs, place).items():
      first = mine[0]
      row = [first["model"], _pipeline(first), str(first["num_devices"]),
             str(first["num_processes"]),
             f"{first['islands']} x {first['devices_per_island']}", where[1]]
      for s in names:
        got, one = medians.get((where, s)), medians.get(((1, "loopback"), s))
        if not got:
          row += ["–"] * 5
          continue
        last = got[1]
        counted, analytic = (last.get("link_bytes_per_step"),
                             last.get("link_bytes_per_step_analytic"))
        row += [bands.band_cell(got[0]),
                f"{got[0][0] / one[0][0]:.3f}" if one else "–",
                f"{counted:,.0f}" if counted else "–",
                f"{analytic:,.0f}" if analytic else "–",
                _ideal_link_fraction(last, medians)]
      rows.append(row + [_published_fraction(first)])
  return header, rows


def _pipeline(r: dict) -> str:
  """'S x M' for a pipelined run (its stages split across the islands), else '–'."""
  stages = r.get("pipeline_stages") or 1
  return f"{stages} x {r['micro_batches']}" if stages > 1 else "–"


def _ideal_link_fraction(r: dict, medians: dict) -> str:
  """Step time on an unshaped link plus the bytes one island sends at the rate."""
  from tf_tput.runtime import islands
  rate = islands.parse_rate(r["dcn_rate"]) if r.get("dcn_rate") else None
  base = medians.get(((r["islands"], islands.NO_LIMIT), r["system"]))
  one = medians.get(((1, "loopback"), r["system"]))
  if not rate or not base or not one or not r.get("link_bytes_per_step"):
    return "–"
  base_s = base[1]["step_time_s"]["median"]
  transfer_s = r["link_bytes_per_step"] / r["islands"] * 8 / rate
  one_s = one[1]["step_time_s"]["median"]
  return f"{one_s / (base_s + transfer_s):.3f}"


def _published_fraction(r: dict) -> str:
  if (r.get("pipeline_stages") or 1) > 1:
    pub = published.MULTI_ISLAND_PIPELINE.get(r["model"])
    return (f"{pub.fraction:g} (S={pub.stages}, M={pub.micro_batches}, "
            f"{pub.islands} x {pub.cores_per_island})" if pub else "–")
  pub = published.MULTI_ISLAND.get(r["model"])
  return f"{pub.fraction:g} ({pub.islands} x {pub.cores_per_island})" if pub else "–"
