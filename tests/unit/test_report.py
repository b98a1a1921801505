"""tf_tput/report: tables, spreads, comparison verdicts, CSV rows, report.md, and the
published figures against the shared reference file."""

import itertools
import json

import pytest

from tf_tput import REPO_ROOT
from tf_tput.report import (bands, compare, configs, console, csv_rows, dispatch,
                            document, footnotes, islands_table, peaks, published,
                            table1, table2)

from record_fixtures import ENV, micro_record, train_record

SHARED_REFERENCE = REPO_ROOT.parent / "shared" / "reference" / "pathways_2022.json"


def test_published_figures_equal_the_shared_reference():
  if not SHARED_REFERENCE.is_file():
    pytest.skip(f"{SHARED_REFERENCE} is not on this machine")
  ref = json.loads(SHARED_REFERENCE.read_text())
  # Each copied figure built from the file by its field's name: a field that reads
  # another column of the file fails here.
  assert {row["model"]: published.T5Row(
      params=row["params_as_published"], cores=row["tpu_cores"],
      jax_tokens_per_sec=row["jax"], pathways_tokens_per_sec=row["pathways"])
          for row in ref["table1_t5"]["rows"]} == published.TABLE1_T5
  assert [published.DecoderRow(config=r["config"], stages=r["stages"],
                               micro_batches=r["micro_batches"], cores=r["tpu_cores"],
                               tokens_per_sec=r["tokens_per_sec"])
          for r in ref["table2_decoder_3b"]["rows"]] == published.TABLE2_DECODER_3B
  assert [published.CrossoverRow(hosts=r["hosts"], tpus=r["tpus"], config=r["config"],
                                 ms=r["ms"])
          for r in ref["fig6_crossover"]["rows"]] == published.FIG6_CROSSOVER_MS
  islands = {model: published.IslandsRow(
      islands=row["islands"], cores_per_island=row["per_island"],
      bytes_per_reduction=float(row["bytes_per_reduction"].split()[0]) * 1e9,
      fraction=float(str(row["fraction_of_single_island_throughput"]).split()[-1]))
             for model, row in ref["multi_island_dcn"].items() if model != "note"}
  assert islands == published.MULTI_ISLAND
  assert ref["table1_t5"]["hardware"] == published.HARDWARE
  assert ref["paper"] == published.CITATION


def test_one_run_spread_is_its_p10_p90_step_rate():
  r = train_record(tokens_per_sec=2000.0, step_s=(0.8, 1.0, 1.6))
  median, low, high = bands.tokens_band([r])
  assert median == 2000.0
  assert low == pytest.approx(2048 / 1.6) and high == pytest.approx(2048 / 0.8)


def test_several_runs_spread_covers_run_to_run_range():
  runs = [train_record(tokens_per_sec=t, step_s=(2048 / t,) * 3, run_id=str(t))
          for t in (1000.0, 1500.0, 3000.0)]
  assert bands.tokens_band(runs) == (1500.0, pytest.approx(1000.0), pytest.approx(3000.0))


def _fixture_records() -> list:
  return [
      train_record("t5_base", "mtf", 100.0, step_s=(19, 20, 21), run_id="a"),
      train_record("t5_base", "mtf", 120.0, step_s=(16, 17, 18), run_id="b"),
      train_record("t5_base", "jax", 330.0, step_s=(6, 6.2, 6.5), run_id="c"),
      train_record("t5_small", "mtf", 800.0, run_id="d"),
      train_record("t5_small", "jax", status="failed", run_id="e"),
      train_record("t5_small", "jax", status="interrupted", run_id="g", signal="SIGTERM",
                   error="SIGTERM after 5 step(s), 4 of them measured"),
      train_record("decoder_tiny", "jax", 40000.0, arch="decoder", inputs_length=None,
                   run_id="f"),
  ]


def test_table1_one_row_per_configuration_and_system():
  header, rows = table1.table1(_fixture_records())
  assert header == ["model", "params", "dtype", "devices", "mesh", "strategy", "batch",
                    "system", "runs", "tokens/s [spread]", "step median (s)", "MFU",
                    "vs mtf", "startup (s): build + warmup",
                    "published JAX / Pathways tokens/s (TPUv3 cores)",
                    "implied MFU (derived)"]
  by_row = {(row[0], row[7]): dict(zip(header, row, strict=True)) for row in rows}
  # The baseline first in each configuration; a system that did not run it has no row.
  assert list(by_row) == [("t5_base", "mtf"), ("t5_base", "jax"), ("t5_small", "mtf"),
                          ("t5_small", "jax"), ("decoder_tiny", "jax")]
  base_mtf, base_jax = by_row[("t5_base", "mtf")], by_row[("t5_base", "jax")]
  assert base_mtf["tokens/s [spread]"].startswith("110 ")  # median of 100 and 120
  assert base_mtf["runs"] == "2" and base_mtf["step median (s)"] == "18.500"
  assert base_mtf["vs mtf"] == "1.00x" and base_mtf["MFU"] == "25.0%"
  assert base_jax["vs mtf"] == f"{330 / 110:.2f}x" and base_jax["runs"] == "1"
  assert base_mtf["startup (s): build + warmup"] == "3.0 + 2.0"  # medians of the runs
  published_cells = (base_mtf["published JAX / Pathways tokens/s (TPUv3 cores)"],
                     base_mtf["implied MFU (derived)"])
  assert published_cells == (
      "618,000 / 618,000 (32)", f"{100 * published.implied_mfu('t5_base', 618000, 32):.1f}%")
  assert (base_jax["published JAX / Pathways tokens/s (TPUv3 cores)"],
          base_jax["implied MFU (derived)"]) == published_cells  # on every system's row
  small = by_row[("t5_small", "jax")]
  assert (small["tokens/s [spread]"], small["runs"], small["vs mtf"]) == (
      footnotes.NO_OK_RUN, "0 (1 failed, 1 interrupted)", "–")  # neither counted
  assert small["published JAX / Pathways tokens/s (TPUv3 cores)"] == "–"
  assert small["startup (s): build + warmup"] == "–"
  assert small["implied MFU (derived)"] == "–"
  assert by_row[("decoder_tiny", "jax")]["vs mtf"] == "–"  # no mtf run to divide by


def test_table1_adds_a_row_not_columns_per_system():
  records = _fixture_records()
  header, rows = table1.table1(records)
  more = records + [train_record("t5_base", name, 200.0, run_id=name)
                    for name in ("tf2", "pathways_like")]
  more_header, more_rows = table1.table1(more)
  assert more_header == header and len(more_rows) == len(rows) + 2
  row = dict(zip(header, next(r for r in more_rows if r[7] == "tf2"), strict=True))
  assert row["vs mtf"] == f"{200 / 110:.2f}x"
  # Without mtf the first system by name is the baseline.
  header, rows = table1.table1([r for r in more if r["system"] != "mtf"])
  assert "vs jax" in header
  jax_row = dict(zip(header, next(r for r in rows if r[:1] == ["t5_base"] and r[7] == "jax"), strict=True))
  tf2_row = dict(zip(header, next(r for r in rows if r[7] == "tf2"), strict=True))
  assert jax_row["vs jax"] == "1.00x" and tf2_row["vs jax"] == f"{200 / 330:.2f}x"


def test_a_variant_is_a_system_of_its_own_beside_its_default_way():
  """torch compiled and torch eager on one configuration: two rows, each with its
  ratio to mtf; a record without a variant is left as it is."""
  mtf = train_record("t5_base", "mtf", 100.0, run_id="m")
  eager = train_record("t5_base", "torch", 120.0, run_id="e")
  compiled = configs.variant_as_system(train_record(
      "t5_base", "torch", 150.0, run_id="c", variant="TorchOptions.compile=True"))
  assert configs.variant_as_system(eager) is eager
  assert compiled["system"] == "torch [TorchOptions.compile=True]"
  header, rows = table1.table1([mtf, eager, compiled])
  ratios = {row[7]: dict(zip(header, row, strict=True))["vs mtf"] for row in rows}
  assert ratios == {"mtf": "1.00x", "torch": "1.20x",
                    "torch [TorchOptions.compile=True]": "1.50x"}
  assert configs.train_key(eager) != configs.train_key(compiled)  # --compare apart too


def test_peak_lines_list_each_distinct_peak_once():
  host = ("measured: jax 2048x2048 float32 matmul on the host CPU (2 cores) = {} GFLOP/s, "
          "shared by 1 virtual device(s)")
  again = "; the higher of two probes, before and after the run (50 and {} GFLOP/s per device)"
  records = [
      train_record(system="jax", peak_flops_per_device=60e9, run_id="a",
                   peak_source=host.format(60) + again.format(60)),
      train_record(system="jax", peak_flops_per_device=93.4e9, run_id="b",
                   peak_source=host.format(93) + again.format(93)),
      train_record("t5_small", "jax", peak_flops_per_device=88e9, run_id="c",
                   peak_source=host.format(88)),
      train_record(system="mtf", peak_flops_per_device=989.4e12, run_id="d",
                   peak_source="table:h200:bfloat16"),
      train_record(system="mtf", peak_flops_per_device=None, mfu=None, run_id="e",
                   peak_source="none: no peak table entry for 'Tesla T4' at float32")]
  lines = peaks.peak_lines(records)
  text = "\n".join(lines)
  assert len(lines) == 3, text  # one per distinct peak, however many runs used it
  assert max(len(line) for l in lines for line in l.splitlines()) <= peaks.PEAKS_WIDTH
  assert " ".join(lines[0].split()) == (
      "- measured: jax 2048x2048 float32 matmul on the host CPU (2 cores), shared by 1 "
      "virtual device(s): 60–93.4 GFLOP/s/device; 3 run(s): jax t5_tiny batch:2;model:2 "
      "×2, jax t5_small batch:2;model:2")
  assert " ".join(lines[1].split()) == ("- none: no peak table entry for 'Tesla T4' at "
                                        "float32: no peak; 1 run(s): mtf t5_tiny "
                                        "batch:2;model:2")
  assert lines[1].splitlines()[1].startswith("    ")  # wrapped lines are indented
  assert lines[2].startswith("- table:h200:bfloat16: 989 TFLOP/s/device; 1 run(s): mtf")
  assert "GFLOP/s per device" not in text  # the probes' own figures stay in the records


def test_micro_table_statuses_and_order():
  records = [micro_record("jax", "opbyop", run_id="1"),
             micro_record("jax", "chained", status="not_applicable", run_id="2"),
             micro_record("tf", "opbyop", repeats=(10.0, 20.0, 30.0), run_id="3"),
             micro_record("tf", "opbyop", hosts=2, status="failed", run_id="4")]
  header, rows = dispatch.micro_table(records)
  assert header == ["hosts", "devices", "tf opbyop", "jax opbyop", "jax chained"]
  assert rows[0] == ["1", "2", "20 [10–30]", "1,000 [900–1.1k]", "not applicable"]
  assert rows[1] == ["2", "4", "failed", "not run", "not run"]


def _crossover(system, hosts, ms, n, rate, measured=None, **kw):
  return micro_record(system, hosts=hosts, repeats=(rate,) * 3, matmul_n=n,
                      computation_ms=ms, computation_ms_measured=measured, chain_length=1,
                      run_id=f"{system}{hosts}{ms}", **kw)


def test_crossover_table_shows_asked_and_measured_ms_and_the_share_of_jax():
  records = [_crossover("jax", 1, 3.0, 90, 400.0, 3.6),
             _crossover("tf", 1, 3.0, 90, 300.0, 3.4),
             _crossover("jax", 1, 0.3, 42, 2000.0, 0.5),
             _crossover("tf", 1, 0.3, 42, 500.0, 0.4),
             _crossover("tf", 2, 0.3, 42, 0.0, status="failed"),
             # From before computation_ms_measured existed: shown as unknown.
             {k: v for k, v in _crossover("jax", 2, 0.3, 42, 100.0).items()
              if k != "computation_ms_measured"}]
  header, rows = dispatch.crossover_table(records)
  assert header == ["hosts", "devices", "ms asked", "ms measured", "matmul n",
                    "tf computations/s", "jax computations/s", "tf/jax"]
  assert rows == [["1", "2", "0.3", "0.45", "42", "500", "2,000", "25%"],
                  ["1", "2", "3", "3.5", "90", "300", "400", "75%"],
                  ["2", "4", "0.3", "–", "42", "failed", "100", "–"]]


# Run-to-run jitter as a shared 2-core VM shows it: single runs of one configuration
# move by up to +-30%, in no order.
JITTER = (0.75, 1.2, 0.9, 1.3)
JITTER_AGAIN = (1.25, 0.8, 1.05, 0.7)


def _runs(rates, prefix, model="t5_tiny", step_s=(0.95, 1.0, 1.05)):
  """One ok run per tokens/s, each with a tight step band (its steps agree)."""
  return [train_record(model, tokens_per_sec=rate, step_s=step_s, run_id=f"{prefix}{i}")
          for i, rate in enumerate(rates)]


def _verdicts(old, new) -> dict:
  header, rows, _ = compare.compare(old, new)
  return {row[0].split()[0]: dict(zip(header, row, strict=True))
          for row in rows if row[1] == "tokens/s"}


def test_compare_of_identical_repeated_runs_finds_no_change():
  old = (_runs([1000 * j for j in JITTER], "o") +
         _runs([300 * j for j in JITTER_AGAIN], "p", model="t5_small"))
  new = (_runs([1000 * j for j in JITTER_AGAIN], "n") +
         _runs([300 * j for j in JITTER], "m", model="t5_small"))
  verdicts = _verdicts(old, new)
  assert {model: row["verdict"] for model, row in verdicts.items()} == {
      "t5_tiny": compare.NOISE, "t5_small": compare.NOISE}
  assert verdicts["t5_tiny"]["runs old/new"] == "4/4"
  assert verdicts["t5_tiny"]["old median [range]"] == "1,050 [750–1,300]"


@pytest.mark.parametrize("factor, expect", [(1.5, compare.FASTER),
                                            (1 / 1.5, compare.SLOWER)])
def test_compare_finds_a_real_change_through_jitter(factor, expect):
  # +-20% about each side's median: the ranges part at 1.5x and at 1/1.5x.
  old = _runs([1000 * j for j in (0.85, 1.1, 0.95, 1.2)], "o")
  new = _runs([1000 * factor * j for j in (0.85, 1.2, 0.95, 1.1)], "n")
  row = _verdicts(old, new)["t5_tiny"]
  assert row["verdict"] == expect
  assert row["new/old"] == f"{factor:.2f}x"


def test_compare_calls_one_run_a_side_undetermined_however_tight_its_steps():
  # The case: identical single runs 0.8x apart, each step band +-5%, which
  # the old rule (step bands apart) called slower.
  old, new = _runs([1000.0], "o"), _runs([800.0], "n")
  assert _verdicts(old, new)["t5_tiny"]["verdict"] == (
      f"undetermined: 1 run a side; a claim needs {compare.MIN_RUNS} a side")
  more = _runs([800.0] * compare.MIN_RUNS, "m")
  assert _verdicts(old, more)["t5_tiny"]["verdict"] == (
      f"undetermined: old 1 run(s), new {compare.MIN_RUNS}; a claim needs "
      f"{compare.MIN_RUNS} a side")


def test_min_runs_keeps_a_false_claim_under_one_in_twenty():
  # Unchanged code: every split of 2n runs' figures into old and new is as likely.
  figures = range(2 * compare.MIN_RUNS)
  splits = [set(old) for old in itertools.combinations(figures, compare.MIN_RUNS)]
  claims = [compare.verdict(sorted(old), sorted(set(figures) - old)) != compare.NOISE
            for old in splits]
  assert sum(claims) * compare.false_claim_odds() == len(splits)   # 2 of 70
  assert 1 / compare.false_claim_odds() < 0.05


def test_compare_names_configurations_only_one_file_has():
  old = [train_record(run_id="o"), train_record("t5_small", run_id="x")]
  new = [train_record(steps=1, tokens_per_sec=100.0, run_id="n"), micro_record()]
  _, rows, notes = compare.compare(old, new)
  assert rows[0][-1].startswith("undetermined")
  assert any("only in --compare" in n and "t5_small" in n for n in notes)
  assert any("only in --against" in n and "micro tf opbyop" in n for n in notes)


def test_compare_of_files_sharing_nothing_lists_both_sides():
  _, rows, notes = compare.compare([train_record("t5_small", run_id="o")], [micro_record()])
  assert rows == []
  assert [n.split(":")[0] for n in notes] == [
      "only in --compare (no ok record in --against)",
      "only in --against (no ok record in --compare)"]


def test_compare_micro_judges_runs_not_their_repeats():
  def micro_runs(repeats, prefix, count):
    return [micro_record(repeats=repeats, run_id=f"{prefix}{i}") for i in range(count)]
  old, new = (900.0, 1000.0, 1100.0), (1500.0, 1600.0, 1700.0)
  _, rows, _ = compare.compare(micro_runs(old, "o", 1), micro_runs(new, "n", 1))
  assert rows[0][-1].startswith("undetermined: 1 run a side")  # repeats are one run
  runs = compare.MIN_RUNS
  _, rows, _ = compare.compare(micro_runs(old, "o", runs), micro_runs(new, "n", runs))
  assert rows[0][-1] == compare.FASTER


def test_csv_rows_fit_the_columns():
  columns = set(csv_rows.csv_columns())
  for r in _fixture_records() + [micro_record()]:
    row = csv_rows.csv_row(r)
    assert set(row) <= columns, set(row) - columns
    assert "config" not in row
  assert csv_rows.csv_row(_fixture_records()[0])["step_time_p90_s"] == 21


def test_report_markdown_sections():
  train = _fixture_records()
  micro = [micro_record(), micro_record("ray", status="skipped", run_id="s"),
           _crossover("tf", 1, 3.0, 90, 300.0, 3.4)]
  text = document.render(train, micro, [("a.jsonl", 6, 2, 0)], [("a.jsonl", 3, "not JSON")],
                         {"tokens_per_sec": "tokens_per_sec.png", "fig5": "fig5_dispatch.png"})
  for needle in ("## Training throughput (Table 1 style)", "![tokens/s per system",
                 "### Failed and interrupted runs", "t5_small jax float32",
                 "failed: step 3: boom", "interrupted: SIGTERM after 5 step(s)",
                 "## Dispatch micro-benchmarks (Fig. 5 style)", "ray opbyop 1 host(s): skipped",
                 "## Crossover (Fig. 6 style)", "| 1 | 2 | 3 | 3.4 | 90 | 300 |",
                 "## Published figures", published.CITATION, "## Conventions",
                 "| Pathways tokens/s | implied MFU (derived) |", "| 125,700 | 33.0% |",
                 "decoder_3b at 1024 tokens (gin/suites/table2_paper.gin)",
                 "## Versions and hardware", "Test CPU", "`a.jsonl:3`: not JSON"):
    assert needle in text, needle
  assert "![step times" not in text  # not drawn, so not linked


def test_a_gather_embedding_run_is_not_compared_with_one_hot_mtf():
  mtf = train_record(system="mtf", tokens_per_sec=1000.0)
  same = train_record(system="jax", tokens_per_sec=1500.0, run_id="j1")
  cheaper = train_record(system="jax", tokens_per_sec=3000.0, run_id="j2",
                         embedding="gather")
  lines = console.format_table([mtf, same, cheaper]).splitlines()
  assert "1.50x" in lines[3] and "float32 gather" not in lines[3]
  assert "float32 gather" in lines[4] and "3.00x" not in lines[4]
  assert configs.config_key(same) != configs.config_key(cheaper)
  old = dict(cheaper)
  del old["embedding"]  # written before records carried it: its own configuration
  assert configs.config_key(old) not in (configs.config_key(same), configs.config_key(cheaper))


def _cluster_env(cpu: str, first_port: int) -> dict:
  from record_fixtures import ENV
  workers = [{"platform": "cpu", "kind": cpu, "count": 2, "task": i,
              "address": f"127.0.0.1:{first_port + i}"} for i in range(2)]
  return dict(ENV, cpu=cpu, accelerators=workers)


def test_mfu_at_best_groups_by_machine_not_by_worker_ports():
  def cluster_run(cpu, port, peak, run_id):
    return train_record(system="mtf", strategy="multi_worker", num_processes=2,
                        env=_cluster_env(cpu, port), peak_flops_per_device=peak,
                        run_id=run_id)
  here = [cluster_run("Test CPU", 20000, 1e11, "a"), cluster_run("Test CPU", 31000, 2e11, "b")]
  assert peaks.best_peaks(here) == {peaks._hardware(here[0]): 2e11 * 4}
  other = cluster_run("Other CPU", 20000, 3e11, "c")
  best = peaks.best_peaks(here + [other])
  assert len(best) == 2 and best[peaks._hardware(here[0])] == 2e11 * 4
  assert best[peaks._hardware(other)] == 3e11 * 4


def test_implied_mfu_of_table2_spmd_by_hand():
  # decoder_3b at table2_paper.gin's 1024 tokens, per token, forward, per layer:
  # q/k/v/o 2*4*2048*2048 + scores and values 2*2*1024*2048 + FFN 2*2*2048*8192
  # = 33,554,432 + 8,388,608 + 67,108,864 = 109,051,904; 62 layers + logits
  # 2*2048*32128 = 6,761,218,048 + 131,596,288 = 6,892,814,336; x 3 for training.
  flops, inputs, targets = published.paper_flops_per_token("decoder_3b")
  assert (flops, inputs, targets) == (3 * 6_892_814_336, None, 1024)
  # 125,700 tokens/s x 20,678,443,008 FLOPs / (128 cores x 61.5e12) = 0.33019...
  assert published.implied_mfu("decoder_3b", 125700, 128) == pytest.approx(0.330193, abs=1e-6)


def test_runs_with_different_sync_every_are_kept_apart():
  mtf = train_record(system="mtf", tokens_per_sec=1000.0)
  every = train_record(system="jax", tokens_per_sec=1500.0, run_id="j1")
  windowed = train_record(system="jax", tokens_per_sec=2000.0, run_id="j2", sync_every=4)
  lines = console.format_table([mtf, every, windowed]).splitlines()
  assert "1.50x" in lines[3] and "sync" not in lines[3]
  assert "float32 sync 4" in lines[4] and "2.00x" not in lines[4]
  old = {k: v for k, v in every.items() if k != "sync_every"}  # written before the field
  assert configs.dtype_label(old) == "float32"
  # ... when the loop fetched every step: the same configuration as sync_every 1.
  assert configs.config_key(old) == configs.config_key(every) != configs.config_key(windowed)
  old_line = console.format_table([mtf, old]).splitlines()[3]
  assert "1.50x" in old_line
  from tf_tput.report import plots
  assert "float32 sync 4" in plots._config_label(windowed)
  assert "sync" not in plots._config_label(every)


def _decoder(system, tps, stages=1, micro=1, mesh="batch:2;model:4", num_devices=128,
             **kw):
  return train_record(model="decoder_3b", system=system, tokens_per_sec=tps,
                      arch="decoder", inputs_length=None, mesh_shape=mesh,
                      num_devices=num_devices, pipeline_stages=stages, micro_batches=micro,
                      schedule="gpipe" if stages > 1 else None,
                      bubble_fraction=(stages - 1) / (micro + stages - 1), **kw)


def test_table2_rows_per_partitioning_against_each_systems_spmd_and_the_paper():
  records = [_decoder("jax", 1000.0, run_id="a"), _decoder("mtf", 500.0, run_id="b"),
             _decoder("jax", 1100.0, 4, 16, "batch:32", run_id="c"),
             _decoder("jax", 900.0, 16, 64, "batch:8", run_id="d"),
             # another global batch: its own group, not compared with the others
             _decoder("jax", 50.0, 4, 16, "batch:32", run_id="e", global_batch=16)]
  header, rows = table2.table2(records)
  by_part = {(row[4], row[3]): dict(zip(header, row, strict=True)) for row in rows}
  spmd = by_part[("SPMD batch:2;model:4", "8 x 128")]
  assert spmd["jax vs SPMD"] == "1.00x" and spmd["mtf vs SPMD"] == "1.00x"
  assert spmd["published Pathways tokens/s (TPUv3 cores)"] == "125,700 (128)"
  s4 = by_part[("pipeline 4x16, batch:32 per stage", "8 x 128")]
  assert s4["jax vs SPMD"] == "1.10x" and s4["mtf tokens/s [spread]"] == "not run"
  assert s4["bubble"] == "0.158" and s4["published vs SPMD"] == "1.06x"
  s16 = by_part[("pipeline 16x64, batch:8 per stage", "8 x 128")]
  assert s16["published Pathways tokens/s (TPUv3 cores)"] == "131,400 (128)"  # not 512's
  alone = by_part[("pipeline 4x16, batch:32 per stage", "16 x 128")]
  assert alone["jax vs SPMD"] == "–"  # no SPMD row at that batch
  figure = published.table_row(_decoder("jax", 1.0, 16, 64, num_devices=512))
  assert (figure.cores, figure.pathways_tokens_per_sec) == (512, 507800)
  assert configs.dtype_label(records[2]) == "float32 pipeline 4x16"


def test_islands_table_fraction_of_one_island_link_bytes_and_ideal_projection():
  def run(islands, rate, tps, median_s, run_id):
    return train_record(model="decoder_deep", system="jax", run_id=run_id, arch="decoder",
                        inputs_length=None, num_devices=8, num_processes=2,
                        tokens_per_sec=tps, step_s=(median_s, median_s, median_s),
                        islands=islands, devices_per_island=8 // islands,
                        dcn_rate=None if islands == 1 else rate,
                        link_bytes_per_step=None if islands == 1 else 2e6,
                        link_bytes_per_step_analytic=None if islands == 1 else 2.1e6)
  records = [run(1, None, 1000.0, 1.0, "a"), run(2, "none", 900.0, 1.1, "b"),
             run(2, "8mbit", 500.0, 2.0, "c")]
  header, rows = islands_table.islands_table(records)
  by_rate = {row[5]: dict(zip(header, row, strict=True)) for row in rows}
  assert by_rate["loopback"]["jax of 1 island"] == "1.000"
  assert by_rate["none"]["jax of 1 island"] == "0.900"
  shaped = by_rate["8mbit"]
  assert shaped["jax of 1 island"] == "0.500" and shaped["islands x devices"] == "2 x 4"
  assert shaped["jax link bytes/step (counted)"] == "2,000,000"
  assert shaped["jax link bytes/step (analytic)"] == "2,100,000"
  # 1 MB per island at 8 Mbit/s: 1 s on top of the unshaped 1.1 s; one island took 1 s.
  assert shaped["jax ideal-link projection"] == f"{1.0 / 2.1:.3f}"
  assert shaped["published fraction"] == "–" and shaped["pipeline"] == "–"
  assert "## Across islands" in document.render(records, [], [("x.jsonl", 3, 0, 0)], [], {})
  # A pipeline across islands is a group of its own, beside Table 2's note for 3B.
  piped = [dict(r, pipeline_stages=4, micro_batches=16, tokens_per_sec=800.0)
           for r in records[:2]]
  header, rows = islands_table.islands_table(records + piped)
  assert len(rows) == 5  # 3 unpipelined, 2 pipelined
  row = dict(zip(header, next(r for r in rows if r[1] == "4 x 16" and r[5] == "none"), strict=True))
  assert row["jax of 1 island"] == "1.000"  # 800 against its own one-island 800
  three_b = dict(piped[0], model="decoder_3b")
  assert islands_table._published_fraction(three_b) == "1 (S=16, M=64, 4 x 32)"


def _started(build_s, warmup_s, run_id, cache=None, **overrides):
  """A run whose startup is build_s + warmup_s; steps steady (throughput within noise)."""
  return train_record(build_s=build_s, warmup_s=warmup_s, first_step_s=warmup_s / 2,
                      compilation_cache=cache, run_id=run_id, **overrides)


@pytest.mark.parametrize("old, new, expect", [
    ([(3.0, 7.0)], [(3.0, 13.0)], compare.STARTUP_SLOWER),   # 10 s -> 16 s: past 1.5x
    ([(3.0, 7.0)], [(3.0, 10.0)], compare.STARTUP_NOISE),    # 10 s -> 13 s: within
    ([(3.0, 12.0)], [(2.0, 3.0)], compare.STARTUP_FASTER),
    # several runs: their range, widened; 10-14 s against 16 s is within noise
    ([(3.0, 7.0), (3.0, 11.0)], [(4.0, 12.0)], compare.STARTUP_NOISE),
])
def test_compare_judges_startup_in_its_own_row(old, new, expect):
  old_runs = [_started(b, w, f"o{i}") for i, (b, w) in enumerate(old)]
  new_runs = [_started(b, w, f"n{i}") for i, (b, w) in enumerate(new)]
  header, rows, _ = compare.compare(old_runs, new_runs)
  assert [row[1] for row in rows] == ["tokens/s", "startup s"]
  throughput, startup = (dict(zip(header, row, strict=True)) for row in rows)
  assert throughput["verdict"].startswith("undetermined")   # too few runs for tokens/s
  assert startup["verdict"] == expect
  assert startup["configuration"] == throughput["configuration"]


def test_compare_names_a_changed_cache_outcome_and_skips_records_without_startup():
  header, rows, _ = compare.compare([_started(3.0, 7.0, "o", cache="hit")],
                                    [_started(3.0, 30.0, "n", cache="miss")])
  assert rows[1][-1] == (f"{compare.STARTUP_SLOWER} (compilation cache: old hit, "
                         "new miss)")
  older = {k: v for k, v in _started(3.0, 7.0, "o").items()
           if k not in ("build_s", "warmup_s")}   # a record from before the fields
  _, rows, _ = compare.compare([older], [_started(3.0, 7.0, "n")])
  assert [row[1] for row in rows] == ["tokens/s"]


def test_compare_does_not_judge_startup_over_other_warmup_steps():
  _, rows, _ = compare.compare([_started(3.0, 7.0, "o", warmup_steps=2)],
                               [_started(3.0, 30.0, "n", warmup_steps=5)])
  assert rows[1][-1] == "startup not judged: warmup steps differ (old [2], new [5])"


def test_table1_startup_says_mixed_where_hits_and_misses_meet():
  header, rows = table1.table1([_started(3.0, 7.0, "a", cache="hit"),
                                _started(9.0, 12.0, "b", cache="miss")])
  assert dict(zip(header, rows[0], strict=True))["startup (s): build + warmup"] == "6.0 + 9.5 mixed"


def test_console_table_shows_startup_beside_tokens_per_second():
  older = {k: v for k, v in _started(3.0, 7.0, "b").items()
           if k not in ("build_s", "warmup_s")}  # a record from before the fields
  lines = console.format_table([_started(3.04, 7.25, "a", cache="hit"), older,
                               train_record(status="failed", run_id="c")]).splitlines()
  assert "startup (s)" in lines[0]
  assert "3.0 + 7.2 hit" in lines[2] and "+" not in lines[3]
  assert len(lines) == 4  # header, rule, the two ok runs: the failed one has no row


# --- partial runs, shared hosts and job arrays, in both reports ---------------------

def _reports(train: list) -> tuple:
  """(console text, report.md text) of the same train records, rendered in-process."""
  return (console.render(train, []),
          document.render(train, [], [("r.jsonl", len(train), 0, 0)], [], {}))


def _console_rows(text: str) -> list:
  """The console table's rows (below its header and rule, up to the first blank line)
  as {column: cell}, cut where the header's columns start."""
  lines = text.splitlines()
  starts = []
  for column in console.COLUMNS:
    starts.append(lines[0].index(column, starts[-1] if starts else 0))
  ends = starts[1:] + [None]
  return [{c: line[a:b].strip() for c, a, b in zip(console.COLUMNS, starts, ends, strict=True)}
          for line in lines[2:lines.index("") if "" in lines else None]]


def _table1_rows(report: str) -> dict:
  """(model, system) -> (runs cell, tokens/s cell) of report.md's Table 1."""
  section = report.split("## Training throughput (Table 1 style)")[1].split("\n\n")[1]
  rows = [[c.strip() for c in line.strip("|").split(" | ")]
          for line in section.splitlines()[2:]]
  return {(row[0], row[7]): (row[8], row[9]) for row in rows}


def _listed(text: str, heading: str) -> list:
  """The '- ' lines under `heading` (either report's), up to the next blank line."""
  after = text.split(heading, 1)[1].lstrip(":").lstrip("\n").split("\n\n")[0]
  return [line for line in after.splitlines() if line.startswith("- ")]


def test_both_reports_keep_partial_runs_out_of_their_tables_and_list_them(tmp_path):
  from tf_tput.records import results
  partial_rate = 777777.0  # what the interrupted run measured: in no table, no ratio
  records = [
      train_record("t5_base", "mtf", 1000.0, run_id="ok-mtf"),
      train_record("t5_base", "jax", 1500.0, run_id="ok-jax"),
      train_record("t5_base", "jax", status="failed", run_id="failed-jax"),
      train_record("t5_base", "jax", status="interrupted", run_id="int-jax", signal="SIGTERM",
                   error="SIGTERM after 5 step(s), 4 of them measured",
                   tokens_per_sec=partial_rate, step_time_s={k: 0.5 for k in
                                                             results.STEP_TIME_KEYS},
                   mfu=0.9, model_tflops_per_sec=9.0, peak_flops_per_device=1e13),
      train_record("t5_small", "mtf", status="interrupted", run_id="int-mtf",
                   signal="SIGINT", error="SIGINT before the first measured step")]
  path = tmp_path / "r.jsonl"
  for r in records:
    results.append(str(path), r)
  train, problems = results.read(str(path))
  assert problems == [] and len(train) == len(records)
  text, report = _reports(train)
  # The same ok runs in the tables: one console row each, pooled in Table 1's rows.
  rows = _console_rows(text)
  assert [(row["model"], row["system"], row["tokens/s"]) for row in rows] == [
      ("t5_base", "mtf", "1,000"), ("t5_base", "jax", "1,500")]
  assert (rows[1]["vs mtf"], rows[1]["MFU@best"]) == ("1.50x", "0.4%")  # ok peaks only
  table1_rows = _table1_rows(report)
  assert table1_rows[("t5_base", "mtf")][0] == "1"
  runs, tokens = table1_rows[("t5_base", "jax")]
  assert runs == "1 (+1 failed, 1 interrupted)" and tokens == "1,500 [1.5k–2.28k]"
  assert table1_rows[("t5_small", "mtf")] == ("0 (1 interrupted)", footnotes.NO_OK_RUN)
  # The same partial runs listed below, in the same words.
  listed = _listed(text, footnotes.PARTIAL_HEADING)
  assert listed == _listed(report, footnotes.PARTIAL_HEADING)
  assert [line.split("(run ")[1].split(",")[0] for line in listed] == [
      "failed-jax", "int-jax", "int-mtf"]
  assert "t5_base jax float32 batch:2;model:2 batch 8" in listed[1]
  assert listed[1].endswith("interrupted: SIGTERM after 5 step(s), 4 of them measured")
  assert ": failed: step 3: boom" in listed[0]
  # No figure of a partial run: its tokens/s, its ratio, its peak.
  for out in (text, report):
    assert "777,777" not in out and "778k" not in out and "777.78x" not in out
  assert "TFLOP/s/device" not in text and "40,000" not in report  # its 4 x 10 TFLOP/s


def _shared(system, tps, run_id, packed=False, concurrent=("other1",)):
  """An ok t5_base run; other tf_tput runs on its host: `concurrent`."""
  return train_record("t5_base", system, tps, run_id=run_id, packed=packed,
                      concurrent_runs=list(concurrent))


def test_runs_that_shared_their_host_are_marked_in_both_reports():
  older = {k: v for k, v in _shared("jax", 2000.0, "older").items()
           if k not in ("concurrent_runs", "packed")}  # written before the fields
  records = [_shared("mtf", 1000.0, "alone", concurrent=()),
             _shared("jax", 1500.0, "unasked"),
             _shared("jax", 1800.0, "asked", packed=True), older,
             _shared("jax", 1600.0, "asked-alone", packed=True, concurrent=())]
  text, report = _reports(records)
  rows = {(row["system"], row["tokens/s"]): (row["host"], row["vs mtf"])
          for row in _console_rows(text)}
  assert rows == {("mtf", "1,000"): ("", "1.00x"), ("jax", "1,500"): ("shared", "1.50x"),
                  ("jax", "1,800"): ("packed", "1.80x"), ("jax", "2,000"): ("", "2.00x"),
                  ("jax", "1,600"): ("", "1.60x")}  # marked, and still compared
  notes = footnotes.sharing_notes(records)
  assert [n.split(":")[0] for n in notes] == ["shared", "packed"]
  assert "rerun it alone" in notes[0] and "(run(s) unasked)" in notes[0]
  assert "--packed" in notes[1] and "(run(s) asked)" in notes[1]
  assert all(note in text for note in notes)
  assert all(f"- {note}" in report for note in notes)
  # Table 1 pools them (they are ok results) and says how many shared.
  runs, tokens = _table1_rows(report)[("t5_base", "jax")]
  assert runs == "4 (1 shared, 1 packed)" and tokens.startswith("1,700 [")
  assert _table1_rows(report)[("t5_base", "mtf")][0] == "1"
  alone = [r for r in records if r["run_id"] in ("alone", "older")]
  assert footnotes.sharing_notes(alone) == []
  assert all("(run(s) " not in out for out in _reports(alone))
  assert {row["host"] for row in _console_rows(_reports(alone)[0])} == {""}
  assert _table1_rows(_reports(alone)[1])[("t5_base", "jax")][0] == "1"


def test_runs_of_slurm_job_arrays_are_counted_per_task_in_both_reports():
  def task(job, task_id, run_id, status="ok"):
    return train_record(status=status, run_id=run_id, array_job_id=job,
                        array_task_id=task_id)
  older = {k: v for k, v in train_record(run_id="g").items()
           if k not in ("array_job_id", "array_task_id")}  # written before the fields
  records = [task("14", 1, "a"), task("14", 0, "b"), task("14", 0, "c", "interrupted"),
             task("14", 0, "d"), task("15", 0, "e", "failed"),
             train_record(run_id="f"), older]  # outside any array
  assert footnotes.array_lines(records) == [
      "array 14: task 0: 2 ok, 1 interrupted; task 1: 1 ok", "array 15: task 0: 1 failed"]
  text, report = _reports(records)
  assert _listed(text, footnotes.ARRAYS_HEADING) == _listed(
      report, f"## {footnotes.ARRAYS_HEADING}") == [
      "- array 14: task 0: 2 ok, 1 interrupted; task 1: 1 ok",
      "- array 15: task 0: 1 failed"]
  assert all(footnotes.ARRAYS_HEADING not in out for out in _reports(records[-2:]))


def test_a_run_whose_launcher_narrowed_its_cpus_is_marked_with_the_fix():
  bound = train_record("t5_base", "jax", 900.0, run_id="bound", launcher="mpirun",
                       env={**ENV, "cpu_affinity": "1", "cpu_binding": "Open MPI's default"})
  free = train_record("t5_base", "jax", 1900.0, run_id="free", launcher="mpirun",
                      env={**ENV, "cpu_affinity": "0-1", "cpu_binding": "none"})
  text, report = _reports([bound, free])
  hosts = {row["tokens/s"]: row["host"] for row in _console_rows(text)}
  assert hosts == {"900": "1 of 2 CPUs", "1,900": ""}
  [note] = [n for n in footnotes.sharing_notes([bound, free]) if "narrowed" in n]
  assert note.startswith("run bound: CPUs narrowed: process 0 ran on CPU(s) 1, 1 of the "
                         "host's 2 (mpirun's binding: Open MPI's default)")
  assert "mpirun --bind-to none" in note and note in text and f"- {note}" in report
