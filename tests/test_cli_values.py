"""Every command's every option that takes a value, given garbage (empty, unknown, the wrong type, huge,
negative, a path that does not exist, a directory where a file is expected, a file where a directory
is): exit 2 and one line naming the option, never a traceback, never exit 0 (amp_bench/cli/values.py).

In-process and torch-free: `main()` is called here, and whatever would start a worker (the fork server,
the device probe, a launch, a cluster job) raises instead, so a value that got past the checks shows
as a failure here rather than as a run. The kinds below are this test's own reading of each option, so
a new option fails test_every_option_that_takes_a_value_has_a_kind_here until it is listed."""
import argparse
import contextlib
import io
import string
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_bench.cli import build_parser, main
from amp_bench.cli.values import takes_value
from conftest import ROOT

SUITE = ROOT / "suites" / "smoke.yaml"
RUN_DIR = ROOT / "tests" / "data" / "predict" / "cpu_run"
TRACE = ROOT / "tests" / "data" / "hta" / "a100_alexnet.json.gz"
A_FILE, A_DIR = SUITE, ROOT / "suites"
MISSING = ROOT / "no-such-folder" / "no-such-file.json"


class WorkerWouldStart(AssertionError):
    """A value got past every check: the command went on to start a worker."""


STARTED = "a worker would start"


@pytest.fixture(autouse=True)
def one_parser(monkeypatch):
    """main() builds its parser per call (8 ms, once a process for a user); these tests call it some 800 times.
    One parser a test serves them all: argparse keeps no state between parse_args calls."""
    import amp_bench.cli
    parser = build_parser()
    monkeypatch.setattr(amp_bench.cli, "build_parser", lambda: parser)

WORKER_STARTS = ("amp_bench.studies.session.start_server", "amp_bench.studies.session.probe",
                 "amp_bench.launchers.forkserver.launch", "amp_bench.studies.cluster.run_on_cluster",
                 "amp_bench.studies.cluster.resume", "amp_bench.studies.cluster_study.run_study_on_cluster",
                 "amp_bench.studies.resume.resume_local")

COUNTS = ("--steps", "--min-steps", "--max-steps", "--repeats", "--batch-size", "--nproc-per-node", "--epochs",
          "--start-batch-size", "--max-batch-size", "--resolution", "--slurm-time", "--slurm-cpus-per-task",
          "--slurm-tasks")
ZERO_OR_MORE = ("--warmup-steps", "--slurm-gpus-per-node", "--seed")
NUMBERS = ("--target-ci", "--case-budget", "--budget", "--timeout-s", "--peak-tflops", "--slurm-mem-gb",
           "--tolerance-pp", "--memory-cap-gb", "--max-age")
KEYS = ("--device", "--precision", "--compile", "--compile-backend", "--compile-cache", "--isolation",
        "--on-contention", "--cpu-allocator", "--executor", "--slurm-cluster", "--modes", "--cpu-isa", "--target",
        "--source-gpu", "--fp32-as", "--format", "--images", "--kind", "--threshold-time", "--threshold-throughput",
        "--threshold-speedup", "--threshold-memory", "--try")
TEXTS = ("--slurm-partition", "--slurm-gres", "--slurm-constraint", "--slurm-account", "--slurm-qos",
         "--slurm-setup", "--reference", "--machine", "--suite", "--note", "--history")
IN_FILES = ("--trace", "--prices", "--annotations", "suite", "files", "suites")
IN_DIRS = ("--resume",)
SOURCES = ("run_dir",)  # predict's: a suite file or a run directory
RESULTS = ("results", "baseline", "candidate")
OUT_DIRS = ("--results-dir", "--reports-dir")
OUT_FILES = ("--csv", "--dashboard", "--output")


def kind_of(command: str, name: str) -> str:
    if command == "nightly" and name == "results":
        return "in_dir"  # one results tree, not a glob
    for kind, names in (("count", COUNTS), ("zero_or_more", ZERO_OR_MORE), ("number", NUMBERS), ("key", KEYS),
                        ("text", TEXTS), ("in_file", IN_FILES), ("in_dir", IN_DIRS), ("source", SOURCES),
                        ("results", RESULTS),
                        ("out_dir", OUT_DIRS), ("out_file", OUT_FILES)):
        if name in names:
            return kind
    raise KeyError(f"{command} {name}: no kind in this test")


GARBAGE = {  # representatives; the hypothesis test below draws more of each
    "count": ["", "many", "2.5", "-3", "0", "10" * 15, "1e3"],
    "zero_or_more": ["", "many", "2.5", "-1", "10" * 15],
    "number": ["", "fast", "-1", "1e30", "nan", "inf", "-inf"],
    "key": ["", "bogus", "fp32,", "cuda:x"],
    "text": ["", "two\nlines"],
    "in_file": ["", str(MISSING), str(A_DIR)],
    "in_dir": ["", str(MISSING), str(A_FILE)],
    "source": ["", str(MISSING)],
    "results": ["", str(MISSING)],
    "out_dir": ["", str(A_FILE)],
    "out_file": ["", str(A_DIR)],
}


def _value_actions():
    """(command, the option's long name or the positional's dest, action) for every value-taking one."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if takes_value(action):
                yield command, (action.option_strings[-1] if action.option_strings else action.dest), action


ACTIONS = [(command, name) for command, name, _ in _value_actions()]
POSITIONALS = {(command, name) for command, name, a in _value_actions() if not a.option_strings}


STUDY_SUITES = {"run": SUITE, "explain": SUITE, "fidelity": ROOT / "suites" / "fidelity.yaml",
                "headroom": ROOT / "suites" / "gpu_check_headroom.yaml"}


def _base(command: str, tmp: Path) -> tuple[list, dict]:
    """(positionals, options) of a command line that is fine apart from the one value under test."""
    if command in STUDY_SUITES:
        return [STUDY_SUITES[command]], {"--no-report": None}
    positionals = {"validate": [SUITE], "ingest": [SUITE], "predict": [RUN_DIR], "report": [RUN_DIR],
                   "history": [RUN_DIR], "compare": [RUN_DIR, RUN_DIR], "export": [RUN_DIR], "nightly": [RUN_DIR]}
    options = {"report": {"--output": tmp / "r.html"}, "compare": {"--output": tmp / "c"},
               "export": {"--format": "bmf"}, "nightly": {"--output": tmp / "n"}}
    return positionals.get(command, []), options.get(command, {})


def _argv(command: str, name: str, garbage: str, tmp: Path) -> list[str]:
    positionals, options = _base(command, tmp)
    if command == "explain" and name in ("--trace", "--modes", "--cpu-isa"):
        positionals, options = [], {"--trace": TRACE, "--no-report": None}
    if command == "run" and name == "--resume":
        positionals = []
    if (command, name) in POSITIONALS:
        index = 1 if (command, name) == ("compare", "candidate") else 0
        positionals = positionals[:index] + [garbage] + positionals[index + 1:] if positionals else [garbage]
    else:
        options = {k: v for k, v in options.items() if k != name}
    flags = [f"{k}={v}" if v is not None else k for k, v in options.items()]
    if (command, name) not in POSITIONALS:
        flags.append(f"{name}={garbage}")
    return [command, *map(str, positionals), *flags]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        for target in WORKER_STARTS:
            stack.enter_context(mock.patch(target, side_effect=WorkerWouldStart(" ".join(argv))))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except WorkerWouldStart:
            code = STARTED
    return code, out.getvalue(), err.getvalue()


def _refused_in_one_line(command: str, name: str, garbage: str, tmp: Path) -> str | None:
    """None when the garbage is refused as it should be; else what went wrong."""
    argv = _argv(command, name, garbage, tmp)
    try:
        code, out, err = _run(argv)
    except Exception as exc:  # a traceback is what this test is for
        return f"{argv}: {type(exc).__name__}: {exc}"
    lines = [line for line in err.splitlines() if line.strip()]
    if code != 2 or len(lines) != 1 or out.strip():
        return f"{argv}: exit {code}, stdout {out[:200]!r}, stderr {err[:300]!r}"
    named = name in lines[0] or (garbage.strip() and garbage.strip() in lines[0])
    return None if named else f"{argv}: the line names neither {name} nor the value: {lines[0]!r}"


def test_every_option_that_takes_a_value_has_a_kind_here():
    assert [kind_of(command, name) for command, name in ACTIONS]
    assert len(ACTIONS) > 100 and {"run", "explain", "predict", "status", "env"} <= {c for c, _ in ACTIONS}


def test_every_option_has_a_check_beyond_its_python_type():
    """argparse's `type=int` takes -3 and 10**30; a Path takes ''. Each value-taking option has a check
    of its own, or argparse's choices."""
    plain = [(c, n) for c, n, a in _value_actions() if a.choices is None and a.type in (None, str, int, float, Path)]
    assert not plain


def test_garbage_for_every_option_is_refused_in_one_line(tmp_path):
    failures = [why for command, name in ACTIONS for garbage in GARBAGE[kind_of(command, name)]
                if (why := _refused_in_one_line(command, name, garbage, tmp_path))]
    assert not failures, "\n".join(failures[:20])


def _garbage(kind: str) -> st.SearchStrategy[str]:
    word = st.text(string.ascii_letters + "_:,", min_size=1, max_size=12).filter(lambda w: not w.lower().startswith(
        ("inf", "nan")) and w.strip(","))
    unknown = word.map(lambda w: f"x{w}")  # no key, device or mode starts with x
    negative = st.integers(max_value=-1).map(str)
    huge = st.integers(min_value=10**12).map(str)
    return {"count": st.one_of(word, negative, huge, st.floats(0.1, 1e3).filter(lambda f: f != int(f)).map(repr)),
            "zero_or_more": st.one_of(word, negative, huge),
            "number": st.one_of(word, negative, st.floats(min_value=1e7, allow_infinity=True).map(repr)),
            "key": unknown, "text": word.map(lambda w: f"{w}\n{w}"),
            "in_file": word.map(lambda w: str(MISSING.parent / w)),
            "in_dir": word.map(lambda w: str(MISSING.parent / w)),
            "source": word.map(lambda w: str(MISSING.parent / w)),
            "results": word.map(lambda w: str(MISSING.parent / w)), "out_dir": st.just(str(A_FILE)),
            "out_file": st.just(str(A_DIR))}[kind]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_garbage_is_refused_in_one_line(tmp_path, data):
    command, name = data.draw(st.sampled_from(ACTIONS), label="option")
    garbage = data.draw(_garbage(kind_of(command, name)), label="value")
    why = _refused_in_one_line(command, name, garbage, tmp_path)
    assert why is None, why


@pytest.mark.parametrize("argv", [["run", str(SUITE), "--steps", "-1"], ["run", str(SUITE), "--batch-size", "-8"],
                                  ["compare", str(RUN_DIR), str(RUN_DIR), "--threshold-time", "-5%"]])
def test_a_negative_value_after_a_space_is_refused_too(argv):
    code, out, err = _run(argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and argv[-2] in err


def test_a_bogus_source_gpu_or_an_empty_target_is_refused_and_a_source_gpu_on_a_cpu_run_said_unused():
    """`predict RUN --source-gpu bogus` on a CPU run, and `--target ""`, were accepted; a real GPU key on a
    CPU run is said not to apply, in one line."""
    for argv in (["predict", str(RUN_DIR), "--target", "h100-sxm", "--source-gpu", "bogus"],
                 ["predict", str(RUN_DIR), "--target", ""]):
        code, _, err = _run(argv)
        assert code == 2 and argv[-2] in err
    from amp_bench.studies.gpu_predictions import predict_source
    predict_source(RUN_DIR, ["l4"])  # its suite's GPU cases recorded (cached): no worker starts below
    code, out, _ = _run(["predict", str(RUN_DIR), "--target", "l4", "--source-gpu", "a100-40gb"])
    assert code == 0 and "--source-gpu a100-40gb: not used: this is a CPU run" in " ".join(out.split())


def test_a_slurm_option_of_a_study_run_here_is_said_not_to_apply():
    code, out, _ = _run(["fidelity", str(ROOT / "suites" / "fidelity.yaml"), "--slurm-account", "lab", "--slurm-time",
                         "30", "--no-report"])
    assert code == STARTED  # a valid study: it goes on to run, here
    assert "note: --slurm-account, --slurm-time apply to --executor slurm only; this fidelity run is local: not used" \
        in out
