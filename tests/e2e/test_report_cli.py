"""tf_tput.report end to end: report directory, PNG files, malformed lines, --compare."""

import csv
import json
import struct

from cli_helpers import error_lines, run_cli
from record_fixtures import micro_record, train_record
from tf_tput.report import compare

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _write(path, records, malformed_at=None) -> None:
  lines = [json.dumps(r) for r in records]
  if malformed_at:
    lines.insert(malformed_at - 1, '{"schema": "tf_tput.result/1", "truncated')
  path.write_text("\n".join(lines) + "\n")


def _png_size(path) -> tuple:
  """(width, height) of a PNG file, checking its signature and first chunk."""
  data = path.read_bytes()
  assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
  assert data[12:16] == b"IHDR"
  return struct.unpack(">II", data[16:24])


def _fixture_files(tmp_path) -> tuple:
  train = tmp_path / "train.jsonl"
  _write(train, [train_record("t5_base", "mtf", 100.0, step_s=(19, 20, 21), run_id="a"),
                 train_record("t5_base", "jax", 330.0, step_s=(6, 6.2, 6.5), run_id="b"),
                 train_record("t5_small", "mtf", 800.0, run_id="c"),
                 train_record("t5_small", "jax", status="failed", run_id="d")],
         malformed_at=3)
  micro = tmp_path / "micro.jsonl"
  _write(micro, [micro_record("tf", "opbyop", hosts=h, run_id=f"t{h}") for h in (1, 2)]
         + [micro_record("jax", "opbyop", hosts=h, repeats=(9e3, 1e4, 1.1e4),
                         run_id=f"j{h}") for h in (1, 2)]
         + [micro_record("jax", "chained", status="not_applicable", run_id="n")])
  return train, micro


def test_report_directory_has_markdown_csv_and_valid_pngs(tmp_path):
  train, micro = _fixture_files(tmp_path)
  out = tmp_path / "report"
  proc = run_cli("tf_tput.report", f"--results={train},{micro}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  # The malformed line is named with its line number; the rest is read.
  assert f"warning: {train}:3: not JSON" in proc.stderr
  pngs = sorted(p.name for p in out.glob("*.png"))
  assert pngs == ["fig5_dispatch.png", "step_times.png", "tokens_per_sec.png"]
  for name in pngs:
    path = out / name
    width, height = _png_size(path)
    assert width >= 600 and height >= 300, (name, width, height)
    assert path.stat().st_size > 5000, name
  report = (out / "report.md").read_text()
  for name in pngs:
    assert f"]({name})" in report
  assert f"`{train}:3`: not JSON" in report
  # Table 1: a row per configuration and system, the published figures on each.
  config = "| t5_base | 0.3M | float32 | 4 | batch:2;model:2 | local | 8 |"
  assert f"{config} mtf | 1 | 100 [" in report and f"{config} jax | 1 | 330 [" in report
  # ... startup (build + warmup, medians) beside the ratio to the baseline
  assert "| 20.000 | 25.0% | 1.00x | 3.0 + 2.0 | 618,000 / 618,000 (32) |" in report
  assert "| 3.30x | 3.0 + 2.0 | 618,000 / 618,000 (32) |" in report
  assert "step 3: boom" in report and "not applicable" in report
  with open(out / "results.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  assert [r["run_id"] for r in rows] == ["a", "b", "c", "d", "t1", "t2", "j1", "j2", "n"]
  assert rows[0]["tokens_per_sec"] == "100.0" and rows[4]["schema"] == "tf_tput.micro/1"


def test_console_table_without_out(tmp_path):
  train, micro = _fixture_files(tmp_path)
  crossover = tmp_path / "crossover.jsonl"
  _write(crossover, [micro_record(s, repeats=(rate,) * 3, matmul_n=90, computation_ms=3.0,
                                  computation_ms_measured=3.4, chain_length=1,
                                  run_id=f"x{s}") for s, rate in (("tf", 300.0),
                                                                  ("jax", 400.0))])
  proc = run_cli("tf_tput.report", f"--results={train},{micro},{crossover}")
  assert proc.returncode == 0, proc.stderr
  # Fig. 6: the asked and the measured duration, the rates and tf's share of jax's.
  assert any(line.split() == ["1", "2", "3", "3.4", "90", "300", "400", "75%"]
             for line in proc.stdout.splitlines()), proc.stdout
  assert "vs mtf" in proc.stdout and "3.30x" in proc.stdout  # jax / mtf on t5_base
  assert "failed: step 3: boom" in proc.stdout
  # Every ok run's peak is the same one: listed once, with the runs that used it.
  assert proc.stdout.count("- measured: test: 100 GFLOP/s/device; 3 run(s):") == 1, proc.stdout
  assert "jax opbyop" in proc.stdout and "not applicable" in proc.stdout
  assert f"warning: {train}:3:" in proc.stderr
  assert not list(tmp_path.glob("*.png"))


def _repeated(model, rates, prefix) -> list:
  return [train_record(model, tokens_per_sec=rate, step_s=(0.95, 1.0, 1.05),
                       run_id=f"{prefix}{model}{i}") for i, rate in enumerate(rates)]


def test_compare_gives_a_noise_aware_verdict(tmp_path):
  old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
  # compare.MIN_RUNS (4) runs a side, +-20-30% apart from run to run: t5_tiny got 1.5x faster, t5_small
  # did not change.
  _write(old, _repeated("t5_tiny", (850, 1100, 950, 1200), "o")
         + _repeated("t5_small", (750, 1200, 900, 1300), "o"))
  _write(new, _repeated("t5_tiny", (1275, 1800, 1425, 1650), "n")
         + _repeated("t5_small", (1250, 800, 1050, 700), "n"))
  proc = run_cli("tf_tput.report", f"--compare={old}", f"--against={new}")
  assert proc.returncode == 0, proc.stderr
  # Per configuration a tokens/s line, then its startup line (judged apart).
  lines = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]
           if "tokens/s" in line}
  assert "1.50x" in lines["t5_tiny"] and "faster (every new run above" in lines["t5_tiny"]
  assert "within noise" in lines["t5_small"]
  startup = [line for line in proc.stdout.splitlines() if "  startup s  " in line]
  assert len(startup) == 2 and all("startup within noise" in line for line in startup)
  assert proc.stdout.splitlines()[-1] == compare.legend()


def test_compare_of_files_sharing_nothing_lists_both(tmp_path):
  old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
  _write(old, [train_record("t5_tiny", run_id="a")])
  _write(new, [train_record("t5_small", run_id="b")])
  proc = run_cli("tf_tput.report", f"--compare={old}", f"--against={new}")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      "no configuration has ok records in both files",
      "only in --compare (no ok record in --against): t5_tiny mtf float32 mesh "
      "batch:2;model:2 (4 dev, 1 proc, local) batch 8 len 128/128",
      "only in --against (no ok record in --compare): t5_small mtf float32 mesh "
      "batch:2;model:2 (4 dev, 1 proc, local) batch 8 len 128/128"]


def test_bad_report_input_is_one_error_line(tmp_path):
  train, _ = _fixture_files(tmp_path)
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  for args, expect in (([f"--results={tmp_path / 'none.jsonl'}"], "none.jsonl"),
                       ([f"--results={train}", f"--out={blocker / 'r'}"], "--out="),
                       ([f"--compare={train}"], "--against"),
                       ([f"--compare={train}", f"--against={tmp_path / 'x.jsonl'}"],
                        "x.jsonl")):
    proc = run_cli("tf_tput.report", *args)
    assert proc.returncode == 2, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr
    assert expect in error_lines(proc.stderr)[0]


def test_a_run_counts_once_however_often_its_record_is_read(tmp_path):
  path = tmp_path / "a.jsonl"
  _write(path, [train_record("t5_base", "mtf", 100.0, run_id="a"),
                train_record("t5_base", "jax", 300.0, run_id="b")])
  out = tmp_path / "report"
  proc = run_cli("tf_tput.report", f"--results={path},{path}", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"warning: {path}: dropped 2 record(s) whose run_id was already read" in proc.stderr
  report = (out / "report.md").read_text()
  assert f"- `{path}`: 2 training record(s), 0 micro-benchmark record(s)\n" in report
  assert (f"- `{path}`: 0 training record(s), 0 micro-benchmark record(s), 2 dropped "
          "(their run_id was read before)") in report
  with open(out / "results.csv", newline="") as f:
    assert [r["run_id"] for r in csv.DictReader(f)] == ["a", "b"]
  assert "| t5_base | 0.3M | float32 | 4 | batch:2;model:2 | local | 8 | mtf | 1 |" in report
