"""Every command README.md shows runs, and the output it shows is what it prints.

The commands are the lines of README.md's ```sh / ```bash blocks (continuation lines
joined). COMMANDS says how this test runs each one: shrunk to a tiny model and a few
steps where the README's form takes longer, in a temporary directory (so results/ and
reports/ land there), in README order (the report reads what the runs wrote). A
command the README gains that COMMANDS does not cover fails
test_every_readme_command_is_covered, so no command goes untested.

Not run: scripts/bench.sh (minutes of benchmarks) and scripts/test.sh (it runs this
test): test_scripts_exist checks that they exist and are executable, and that .ci/run
runs scripts/test.sh.

A ```text block right after a command's ```sh block is that command's output: each
line shown (but "...") must appear in what the command prints, in order, with numbers,
runs of spaces and table rules made equal, so a sample left behind by a change of format fails.
"""

import dataclasses
import os
import pathlib
import re
import shlex
import shutil

from cli_helpers import REPO, run_cli
from tf_tput.measure import peak_store

README = REPO / "README.md"
PYTHON = ".venv/bin/python"
NOT_RUN = "not run"
SHORT = ["--gin_param=DataConfig.inputs_length=16", "--gin_param=DataConfig.targets_length=16"]

# The suite table1_local shrunk to one tiny run: the same file, a few bindings on top.
SHRUNK_SUITE = """include '{real}'
Suite.matrices = [@TrainMatrix()]
TrainMatrix.models = ['t5_tiny']
TrainMatrix.systems = ['jax']
TrainMatrix.steps = 2
TrainMatrix.warmup_steps = 1
TrainMatrix.gin_params = ['DataConfig.inputs_length = 16', 'DataConfig.targets_length = 16']
"""


@dataclasses.dataclass(frozen=True)
class Shrunk:
  replace: tuple = ()  # (README argument, the argument run instead; {tmp} = the run's dir)
  extra: tuple = ()    # arguments appended (later flags win in absl)


# Every command README.md shows -> how this test runs it.
COMMANDS = {
    "scripts/bench.sh": NOT_RUN,
    "scripts/test.sh": NOT_RUN,
    f"{PYTHON} -m tf_tput.train --system=jax --gin_file=t5_tiny --steps=5 "
    "--results=results/quickstart.jsonl":
        Shrunk(extra=("--steps=2", "--warmup_steps=1", *SHORT)),
    f"{PYTHON} -m tf_tput.report --results=results/quickstart.jsonl": Shrunk(),
    f"{PYTHON} -m tf_tput.suite --suite=table1_local --dry_run": Shrunk(),
    f"{PYTHON} -m tf_tput.suite --suite=table1_local":
        Shrunk(replace=(("--suite=table1_local", "--suite={tmp}/table1_local.gin"),)),
    f"{PYTHON} -m tf_tput.report --results=results/table1_local.jsonl "
    "--out=reports/table1_local": Shrunk(),
}


def readme_commands() -> list:
  """[(command, the output shown after it or None)] in README order."""
  blocks, lines, i = [], README.read_text(encoding="utf-8").splitlines(), 0
  while i < len(lines):
    fence = re.match(r"^```(\w*)\s*$", lines[i])
    if not fence:
      i += 1
      continue
    end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
    blocks.append((fence.group(1), lines[i + 1:end], i))
    i = end + 1
  out = []
  for index, (kind, body, _) in enumerate(blocks):
    if kind not in ("sh", "bash"):
      continue
    commands, pending = [], ""
    for line in body:
      line = pending + line.strip()
      if line.endswith("\\"):
        pending = line[:-1] + " "
        continue
      pending = ""
      if line and not line.startswith("#"):
        commands.append(" ".join(line.split()))
    shown = None
    if index + 1 < len(blocks) and blocks[index + 1][0] == "text":
      shown = blocks[index + 1][1]
    out += [(c, shown if n == len(commands) - 1 else None) for n, c in enumerate(commands)]
  return out


def test_every_readme_command_is_covered():
  shown = [c for c, _ in readme_commands()]
  assert shown, "README.md shows no ```sh commands"
  uncovered = [c for c in shown if c not in COMMANDS]
  stale = [c for c in COMMANDS if c not in shown]
  assert not uncovered, (f"README.md shows commands this test does not run: {uncovered}; "
                         "add each to COMMANDS in tests/e2e/test_readme_commands.py")
  assert not stale, f"COMMANDS has commands README.md no longer shows: {stale}"


def test_scripts_exist():
  for command, how in COMMANDS.items():
    if how == NOT_RUN:
      script = REPO / command.split()[0]
      assert script.is_file() and os.access(script, os.X_OK), f"{script} not executable"
  assert "scripts/test.sh" in (REPO / ".ci/run").read_text(), ".ci/run must run scripts/test.sh"


def _normalized(line: str) -> str:
  """Numbers, runs of spaces and table rules (column widths) made equal."""
  return " ".join(re.sub(r"-{2,}", "--", re.sub(r"\d[\d,.]*", "N", line)).split())


def _assert_shows(command: str, shown: list, printed: str) -> None:
  """Each shown line (but "...") appears in `printed`, in order, numbers aside."""
  remaining = [_normalized(line) for line in printed.splitlines()]
  for line in shown:
    if line.strip() == "...":
      continue
    want = _normalized(line)
    assert want in remaining, (f"README.md shows, after `{command}`:\n  {line}\n"
                               f"but it printed:\n{printed}")
    remaining = remaining[remaining.index(want) + 1:]


def test_readme_commands_run(tmp_path, monkeypatch):
  # A compilation cache of this test's own: the README's first run shows a miss. The
  # session's peak store comes along (tests/conftest.py), as a user's own would be
  # there: the README's output is the same, without probing every framework again.
  session_cache = pathlib.Path(os.environ["XDG_CACHE_HOME"])
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  peaks = pathlib.Path("tf_tput", peak_store.FILE_NAME)
  if (session_cache / peaks).exists():
    (tmp_path / "cache" / peaks).parent.mkdir(parents=True)
    shutil.copy(session_cache / peaks, tmp_path / "cache" / peaks)
  (tmp_path / "table1_local.gin").write_text(SHRUNK_SUITE.format(
      real=REPO / "gin" / "suites" / "table1_local.gin"))
  for command, shown in readme_commands():
    how = COMMANDS.get(command)
    if how in (None, NOT_RUN):
      continue  # None: test_every_readme_command_is_covered fails
    argv = shlex.split(command)
    assert argv[:2] == [PYTHON, "-m"], f"{command}: expected {PYTHON} -m MODULE ..."
    args = list(argv[3:])
    for old, new in how.replace:
      args[args.index(old)] = new.format(tmp=tmp_path)
    done = run_cli(argv[2], *args, *how.extra, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, (f"`{command}` (run as {argv[2]} {args + list(how.extra)}) "
                                  f"exited {done.returncode}:\n{done.stderr[-3000:]}")
    if shown:
      _assert_shows(command, shown, done.stdout)
