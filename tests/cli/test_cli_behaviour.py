"""The CLI behaves like the tools operators know (issue 13, section 5): help with examples, one-line usage
errors, flags without ``<bool>``, one spelling of fault names, options that say when they do not apply,
``agent --trigger`` without an agent, ``fr`` in the verdict format of ``diagnose`` with torchfrtrace's
selection options, ``--max-frames``, progress bars only on a terminal, ``python -m`` entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rankscope.cli.main import COMMANDS, app

runner = CliRunner()


def _run(*args: object, env: dict[str, str] | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def _one_error_line(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("rankscope: error: "), lines[0]
    for noise in ("Traceback", "Usage:", "╭", "│", "Try '"):
        assert noise not in res.output, res.output
    return lines[0]


# -- help --------------------------------------------------------------------------------------------------
def _all_commands() -> list[str]:
    """The lazy commands of the table and any registered eagerly (``register(app)`` in cli/main.py)."""
    import typer

    return typer.main.get_group(app).list_commands(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", _all_commands())
def test_every_command_help_has_examples_and_no_bool_metavar(name: str) -> None:
    res = _run(name, "--help")
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "Examples:" in text
    examples = text.split("Examples:", 1)[1].splitlines()
    assert 1 <= sum(1 for ln in examples if ln.strip().startswith(f"rankscope {name} ")) <= 3, text
    assert "<bool>" not in text  # flags take no value and must not look as if they did


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_command_table_says_what_each_command_says_of_itself(name: str) -> None:
    """``rankscope --help`` lists commands from a table (no command module is imported): keep it true."""
    from rankscope.cli.group import load_command

    cmd = load_command(COMMANDS[name][0], name)
    assert cmd.help is not None and cmd.help.strip().splitlines()[0] == COMMANDS[name][1]


def test_root_help_lists_every_command_with_examples() -> None:
    res = _run("--help")
    assert res.exit_code == 0
    for name, (_, line) in COMMANDS.items():
        assert name in res.stdout and line.split()[0] in res.stdout
    assert "Examples:" in res.stdout
    assert _run().exit_code == 0  # no arguments: the help, on stdout


# -- usage errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["diagnose"], "Missing argument 'PATH'"),
        (["diagnose", ".", "--format", "xml"], "'xml' is not one of 'text', 'json'"),
        (["diagnose", ".", "--bogus"], "No such option: --bogus"),
        (["diagnos", "."], "did you mean 'diagnose'"),
        (["diagnose", ".", "--gpus-per-node", "eight"], "'eight' is not an integer"),
        (["sql", ".", "SELECT 1", "--format", "xls"], "is not one of 'text', 'csv', 'json', 'markdown'"),
        (["report", "."], "nothing to write"),
    ],
)
def test_usage_errors_are_one_line_on_stderr(args: list[str], fragment: str) -> None:
    assert fragment in _one_error_line(_run(*args))


def test_usage_error_from_a_real_process_is_one_line() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "rankscope", "diagnose", "--format"], capture_output=True, text=True, check=False
    )
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("rankscope: error: diagnose: ")


# -- fault names -------------------------------------------------------------------------------------------
def test_demo_lists_its_faults_with_the_harness_spelling() -> None:
    from rankscope.cli.demo import Fault
    from rankscope.harness import faultjob, synthetic

    assert tuple(f.value for f in Fault) == synthetic.FAULTS
    res = _run("demo", "--help")
    for name in synthetic.FAULTS:
        assert name in res.stdout
    err = _one_error_line(_run("demo", "--fault", "slow_rank"))
    assert "'slow-rank'" in err and "'compute-hang'" in err
    # one spelling everywhere: the real fault job too (its old underscore names still read)
    assert all("_" not in f for f in (*synthetic.FAULTS, *faultjob.FAULTS))
    assert faultjob.fault_name("compute_hang") == "compute-hang"
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "compute_hang" not in readme and "slow_rank" not in readme


# -- detect --detector ------------------------------------------------------------------------------------
def test_detect_chooses_among_the_readme_detectors(tmp_path: Path) -> None:
    from rankscope.cli.detect import Detector
    from rankscope.harness.synthetic_metrics import make_metrics
    from rankscope.models import DETECTORS

    assert tuple(d.value for d in Detector) == tuple(DETECTORS)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in DETECTORS)
    run = make_metrics(n_machines=24, duration_s=900, faults={"gpu-throttle": 1}, onset_range_s=(300, 400), seed=3)
    (tmp_path / "m").mkdir()
    run.to_long(job="m").write_parquet(tmp_path / "m" / "metrics.parquet")
    for name in ("peer-mad", "mad", "iforest"):
        res = _run("detect", tmp_path / "m", "--detector", name, "--format", "json")
        assert res.exit_code == 0, res.output
        v = json.loads(res.stdout)
        assert v["culprit_nodes"] == [run.faults[0].node], (name, v["reasons"])
        assert f"of detector {name}" in " ".join(v["reasons"])
    err = _one_error_line(_run("detect", tmp_path / "m", "--detector", "prophet"))
    assert "'peer-change', 'peer-distance', 'peer-mad', 'mad', 'iforest', 'lstm-vae'" in err
    # from the environment or a config file: one line naming the valid detectors when the metrics are scored
    env = _run("detect", tmp_path / "m", env={"RANKSCOPE_PERFORMANCE_DETECTOR": "prophet"})
    assert "unknown detector 'prophet'; valid detectors: peer-change, peer-distance" in _one_error_line(env)
    default = json.loads(_run("detect", tmp_path / "m", "--format", "json").stdout)  # peer-change
    assert (
        default["culprit_nodes"] == [run.faults[0].node] and default["details"]["metrics"]["detector"] == "peer-change"
    )


# -- options that do not apply -------------------------------------------------------------------------------
def test_gpus_per_node_on_a_store_says_it_does_not_apply(tmp_path: Path, probe_dir: Path) -> None:
    st = tmp_path / "store"
    assert _run("ingest", probe_dir / "pyspy" / "text", "--store", st, "--gpus-per-node", "1").exit_code == 0
    res = _run("diagnose", st, "--gpus-per-node", "4", "--format", "json")
    assert res.exit_code == 0, res.output
    assert "--gpus-per-node does not apply to a store" in res.stderr
    assert json.loads(res.stdout)["culprit_nodes"] == ["node-3"]
    quiet = _run("diagnose", st, "--format", "json")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_save_on_a_dump_directory_is_refused(probe_dir: Path) -> None:
    err = _one_error_line(_run("diagnose", probe_dir / "pyspy" / "text", "--save"))
    assert "--save needs a store PATH" in err


def test_report_options_that_need_evidence_say_so_on_a_verdict_file(tmp_path: Path, probe_dir: Path) -> None:
    v = _run("diagnose", probe_dir / "pyspy" / "text", "--gpus-per-node", "1", "--format", "json")
    (tmp_path / "v.json").write_text(v.stdout)
    res = _run("report", tmp_path / "v.json", "-o", tmp_path / "r.html", "--layout", "tp=2", "--gpus-per-node", "1")
    assert res.exit_code == 0, res.output
    assert "--layout, --gpus-per-node do not apply to a verdict file" in res.stderr


# -- agent --trigger ---------------------------------------------------------------------------------------
def test_trigger_without_an_agent_says_so_and_fails(tmp_path: Path) -> None:
    res = _run("agent", "--run-dir", tmp_path, "--trigger")
    assert res.exit_code == 1
    assert res.stderr.startswith(f"rankscope: error: no agent running for {tmp_path} ")
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "trigger").exists()
    (tmp_path / "agent.pid").write_text("999999999\n")  # a pid file left by an agent that died
    assert _run("agent", "--run-dir", tmp_path, "--trigger").exit_code == 1


def test_trigger_with_a_live_agent_writes_the_request(tmp_path: Path) -> None:
    (tmp_path / "agent.pid").write_text(f"{os.getpid()}\n")
    res = _run("agent", "--run-dir", tmp_path, "--trigger")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "trigger").read_text().startswith("rounds=")


# -- fr -------------------------------------------------------------------------------------------------------
def test_fr_speaks_the_verdict_format_of_diagnose(fr_gloo: Path) -> None:
    # the probe's job re-captured through the hook: its dumps carry their capture time, so the FR names rank 3
    fr = _run("fr", fr_gloo / "hang", "--gpus-per-node", "1")
    dg = _run("diagnose", fr_gloo / "hang", "--gpus-per-node", "1")
    assert fr.exit_code == 0 and dg.exit_code == 0, (fr.output, dg.output)
    head = [ln.split(":")[0] for ln in fr.stdout.splitlines()[:4]]
    assert (
        head
        == [ln.split(":")[0] for ln in dg.stdout.splitlines()[:4]]
        == [
            "verdict",
            "isolate",
            "culprit",
            "suspect ranks",
        ]
    )
    fj = json.loads(_run("fr", fr_gloo / "hang", "--gpus-per-node", "1", "--format", "json").stdout)
    dj = json.loads(_run("diagnose", fr_gloo / "hang", "--gpus-per-node", "1", "--format", "json").stdout)
    assert set(fj) == set(dj) and fj["culprit_nodes"] == dj["culprit_nodes"] == ["node-3"]


def test_fr_selection_options_like_torchfrtrace(probe_dir: Path) -> None:
    res = _run("fr", probe_dir / "fr", "--gpus-per-node", "1", "--selected-ranks", "2-3", "--print-stack-trace")
    assert res.exit_code == 0, res.output
    table = res.stdout.split("entries (oldest first", 1)[1]
    assert "rank 2" in table and "rank 3" in table and "rank 0" not in table and "rank 1" not in table
    assert "default_pg:all_reduce #6" in table  # ranks 2 reached the collective rank 3 never enqueued
    assert "stack traces (innermost frame first):" in table and "fr_gloo.py" in table
    none = _run("fr", probe_dir / "fr", "--gpus-per-node", "1", "-j", "--pg-filters", "no-such-group")
    assert "no entry matches --pg-filters no-such-group" in none.stdout
    js = json.loads(
        _run("fr", probe_dir / "fr", "--gpus-per-node", "1", "--selected-ranks", "3", "--format", "json").stdout
    )
    # the probe's own dumps carry no capture time: no time evidence of a hang, nobody named
    assert {e["rank"] for e in js["entries"]} == {3} and js["verdict"] == "inconclusive" and not js["culprit_nodes"]
    assert "is not a rank" in _one_error_line(_run("fr", probe_dir / "fr", "--selected-ranks", "3-x"))


# -- --max-frames --------------------------------------------------------------------------------------------
def test_max_frames_shows_more_than_eight(tmp_path: Path) -> None:
    from rankscope.harness.synthetic import generate_job

    job = generate_job("tp=2,pp=2,dp=2", gpus_per_node=2, fault="compute-hang", seed=3)
    job.write_dir(tmp_path / "d", fmt="pyspy-text")
    args = ("diagnose", tmp_path / "d", "--layout", "tp=2,pp=2,dp=2", "--gpus-per-node", "2")
    default, everything = _run(*args), _run(*args, "--max-frames", "0")
    assert "outer frame(s)" in default.stdout and "outer frame(s)" not in everything.stdout
    assert len(everything.stdout.splitlines()) > len(default.stdout.splitlines())
    assert "outer frame(s)" in _run(*args, "--max-frames", "1").stdout


# -- progress ------------------------------------------------------------------------------------------------
def test_long_reads_report_progress_only_where_a_bar_is_wanted(tmp_path: Path, probe_dir: Path) -> None:
    from rankscope.cli import console
    from rankscope.datasets.loading.inputs import load_inputs
    from rankscope.spine import reporting_progress

    calls: list[tuple[str, int | None, int]] = []

    class Recorder:
        def __init__(self, label: str, total: int | None) -> None:
            self.label, self.total, self.n = label, total, 0

        def advance(self, n: int = 1) -> None:
            self.n += n

        def close(self) -> None:
            calls.append((self.label, self.total, self.n))

    with reporting_progress(Recorder):
        load_inputs(probe_dir / "pyspy" / "text", gpus_per_node=1)
    assert calls and calls[0][0] == "reading text" and calls[0][2] == 4  # the four dump files
    calls.clear()
    load_inputs(probe_dir / "pyspy" / "text", gpus_per_node=1)
    assert calls == []  # no reporter installed: the library reports nothing
    # the CLI's choice: a bar on a terminal, nothing when piped, RANKSCOPE_PROGRESS forces either way
    os.environ.pop("RANKSCOPE_PROGRESS", None)
    assert console.progress_wanted() is False  # pytest captures stderr: not a terminal
    os.environ["RANKSCOPE_PROGRESS"] = "1"
    try:
        assert console.progress_wanted() is True
    finally:
        del os.environ["RANKSCOPE_PROGRESS"]


def test_the_bar_draws_on_a_terminal_and_stays_silent_when_piped(tmp_path: Path) -> None:
    """A real pseudo-terminal sees the bar of a slow read; a pipe sees nothing on stderr."""
    import pty

    code = (
        "import time; from rankscope.cli.console import long_reads; from rankscope.spine import progress\n"
        "with long_reads():\n"
        "    for _ in progress(range(400), 'reading dumps'):\n"
        "        time.sleep(0.004)\n"
    )
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stderr == ""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execv(sys.executable, [sys.executable, "-c", code])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    assert b"reading dumps" in out


# -- entry points --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", ["rankscope", "rankscope.collectors.daemon", "rankscope.harness.faultjob"])
def test_documented_module_entry_points_print_usage(module: str) -> None:
    p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert f"python -m {module}" in p.stdout and "usage" in p.stdout.lower()


# -- start-up ------------------------------------------------------------------------------------------------
HEAVY = ("rich", "pydantic", "numpy", "polars", "pyarrow", "duckdb", "sklearn", "scipy", "matplotlib", "torch")


def _modules_after(args: list[str]) -> set[str]:
    code = (
        "import sys, runpy\n"
        f"sys.argv = ['rankscope', *{args!r}]\n"
        "try:\n"
        "    runpy.run_module('rankscope', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    return set(p.stderr.strip().splitlines()[-1].split())


def test_help_imports_nothing_heavy() -> None:
    for args in (["--help"], ["diagnose", "--help"], ["report", "--help"], ["sql", "--help"]):
        loaded = _modules_after(args)
        assert not loaded & set(HEAVY), (args, sorted(loaded & set(HEAVY)))


def test_diagnosing_stack_dumps_imports_only_what_stacks_need(probe_dir: Path) -> None:
    loaded = _modules_after(["diagnose", str(probe_dir / "pyspy" / "text"), "--gpus-per-node", "1"])
    assert "numpy" in loaded  # the topology and the clustering use it
    assert not loaded & {"rich", "pydantic", "polars", "pyarrow", "duckdb", "sklearn", "scipy", "matplotlib"}


def test_a_command_module_loads_only_when_used() -> None:
    code = (
        "import sys; from typer.testing import CliRunner; from rankscope.cli.main import app\n"
        "CliRunner().invoke(app, ['--help'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('rankscope.cli.')))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "rankscope.cli.diagnose" not in p.stdout and "rankscope.cli.report" not in p.stdout
