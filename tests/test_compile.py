"""torch.compile as an axis: the suite keys, case ids, and real CPU runs of tiny models through the
worker (dynamo's counters for graph breaks and recompiles, compile_error, the summary's pairing).
Most runs use the "eager" backend (dynamo only, no code generation) so they take seconds; one runs
inductor's C++ backend. No assertion depends on a timing."""

import pandas as pd
import pytest

from amp_bench.analysis.speedups import summarize
from amp_bench.errors import SuiteError
from amp_bench.suite import load_suite
from conftest import ROOT, amp_bench_cli

MODELS = """models:
  - {ref: "python:toy_models:mlp", label: mlp}
  - {ref: "python:toy_models:graph_break", label: breaks}
  - {ref: "python:toy_models:shape_change", label: reshapes, options: {at_call: 12}}
"""
SETTINGS = "batch_sizes: [4]\nprecisions: [fp32]\nwarmup_steps: 2\nsteps: 10\ntimeout_s: 300\nexplain: false\n"


def cli(*args):
    """The command run in this process (the run's workers are forked as from a command's): no second interpreter
    importing the CLI's libraries."""
    return amp_bench_cli(*args, env={"COLUMNS": "200"})


def test_compile_axis_and_case_ids(write_suite):
    suite = load_suite(write_suite(MODELS + SETTINGS + "compile: [false, true, reduce-overhead]\n"))
    cases = suite.cases("cpu")
    ids = [c.case_id for c in cases if c.model.label == "mlp"]
    assert ids == ["mlp-bs4-fp32", "mlp-bs4-fp32-compiled", "mlp-bs4-fp32-c-reduce-overhead"]
    assert {c.compile_backend for c in cases} == {"inductor"} and not any(c.compile_fullgraph for c in cases)
    eager = load_suite(write_suite(MODELS + SETTINGS, "eager.yaml")).cases("cpu")
    assert [c.case_id for c in eager] == ["mlp-bs4-fp32", "breaks-bs4-fp32", "reshapes-bs4-fp32"]  # unchanged
    over = suite.cases("cpu", {"compile": ["false", "true"], "compile_cache": "cold"})
    assert {c.compile_mode for c in over} == {"eager", "default"} and {c.compile_cache for c in over} == {"cold"}


@pytest.mark.parametrize("text, expected", [
    ("compile: [fast]", "compile[0]: expected one of default, reduce-overhead"),
    ("compile: [true, default]", "compile[1]: duplicate case"),
    ("compile_backend: tvm", "compile_backend: expected one of"),
    ("compile_cache: hot", "compile_cache: expected one of warm, cold"),
    ("fidelity: {compile: sometimes}", "fidelity.compile: expected one of"),
])
def test_bad_compile_keys_name_file_and_field(write_suite, text, expected):
    path = write_suite(MODELS + SETTINGS + text + "\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert any(str(path) in line and expected in line for line in err.value.lines), err.value.lines


@pytest.mark.slow
def test_cpu_run_reports_compile_breaks_and_window_recompiles(write_suite, tmp_path):
    path = write_suite(MODELS + SETTINGS + "compile_backend: eager\n")
    proc = cli("run", str(path), "--device", "cpu", "--compile", "false", "--compile", "true",
               "--results-dir", str(tmp_path / "results"), "--no-report", "--target", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next((tmp_path / "results").iterdir())
    table = pd.read_csv(run_dir / "results.csv").set_index("case_id")
    assert set(table.index) == {f"{m}-bs4-fp32{s}" for m in ("mlp", "breaks", "reshapes") for s in ("", "-compiled")}
    assert (table.status == "ok").all(), table[["status", "reason"]]
    eager, compiled = table.loc["mlp-bs4-fp32"], table.loc["mlp-bs4-fp32-compiled"]
    assert eager.compile_mode == "eager" and pd.isna(eager.compile_time_s)
    assert compiled.compile_mode == "default" and compiled.compile_backend == "eager"
    assert compiled.compile_time_s > 0 and compiled.compile_first_step_ms > 0
    assert compiled.graph_breaks == 0 and compiled.recompiles_in_window == 0 and compiled.compile_settled
    assert compiled.compile_cache == "warm" and compiled.compile_cache_dir == "compile-cache/shared"
    breaks = table.loc["breaks-bs4-fp32-compiled"]
    assert breaks.graph_breaks >= 1 and breaks.unique_graphs >= 2 and breaks.recompiles_in_window == 0
    assert "builtin" in breaks.graph_break_reasons or "print" in breaks.graph_break_reasons
    reshapes = table.loc["reshapes-bs4-fp32-compiled"]
    assert reshapes.recompiles_in_window >= 1 and "recompiled inside the measured window" in reshapes.warnings
    assert pd.isna(table.loc["reshapes-bs4-fp32"].recompiles_in_window)  # eager: no compile figures
    log = (run_dir / reshapes.log_file).read_text()
    assert "[amp_bench] compile:" in log
    summary = summarize(table.copy().reset_index())  # copy(): read_csv of ~250 columns leaves >100 blocks
    mlp = summary[summary.model_label == "mlp"].set_index("compile_mode")
    assert mlp.loc["default", "speedup_vs_eager"] > 0 and mlp.loc["default", "speedup_vs_fp32_eager"] > 0
    assert mlp.loc["eager", "speedup_vs_fp32"] == 1.0 and mlp.loc["default", "speedup_vs_fp32"] == 1.0
    assert "compile" in proc.stdout and "vs eager" in proc.stdout


@pytest.mark.slow
def test_fullgraph_on_a_graph_break_is_a_compile_error(write_suite, tmp_path):
    path = write_suite("models:\n" + MODELS.splitlines()[2] + "\n" + SETTINGS +
                       "compile: true\ncompile_backend: eager\ncompile_fullgraph: true\ncompile_cache: cold\n")
    proc = cli("run", str(path), "--device", "cpu", "--results-dir", str(tmp_path / "results"),
               "--reports-dir", str(tmp_path / "reports"), "--target", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next((tmp_path / "results").iterdir())
    row = pd.read_csv(run_dir / "results.csv").iloc[0]
    assert row.status == "compile_error" and row.reason.startswith("CompileError: Unsupported")
    assert "\n" not in row.reason
    assert not (run_dir / "compile-cache" / "breaks-bs4-fp32-compiled-r0").exists()  # cold: removed after
    summary = summarize(pd.read_csv(run_dir / "results.csv"))
    assert summary.iloc[0].status == "compile_error"
    report = next((tmp_path / "reports").glob("*.md"), None)
    assert report is None or "compile_error" in report.read_text()


@pytest.mark.slow
def test_inductor_cpu_compiles_eager_and_compiled(write_suite, tmp_path):
    """The real thing: inductor's C++ backend, eager and compiled, with the report's compile section."""
    # the mlp alone: graph breaks are dynamo's, counted the same under the eager backend (above)
    path = write_suite("\n".join(MODELS.splitlines()[:2]) + "\n" +
                       SETTINGS.replace("steps: 10", "steps: 5") + "compile: [false, true]\n")
    proc = cli("run", str(path), "--device", "cpu", "--results-dir", str(tmp_path / "results"),
               "--reports-dir", str(tmp_path / "reports"), "--target", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = next((tmp_path / "results").iterdir())
    table = pd.read_csv(run_dir / "results.csv").set_index("case_id")
    assert (table.status == "ok").all(), table[["status", "reason"]]
    compiled = table.loc["mlp-bs4-fp32-compiled"]
    assert compiled.compile_backend == "inductor" and compiled.compile_time_s > 0
    assert any((run_dir / "compile-cache" / "shared").iterdir())  # inductor wrote its cache in the run
    assert compiled.graph_breaks == 0
    markdown = next((tmp_path / "reports").glob("*.md")).read_text()
    assert "## torch.compile: precision x compile mode" in markdown and "break-even steps" in markdown


@pytest.mark.slow
def test_fidelity_study_trains_compiled(write_suite, tmp_path):
    """Same seeds and data, the model compiled (dynamo with the eager backend: seconds, not minutes)."""
    from amp_bench.studies.fidelity.orchestration import run_fidelity
    path = write_suite("precisions: [fp32]\ncompile_backend: eager\n"
                       "fidelity: {dataset: digits, epochs: 1, batch_size: 128, seeds: [0], compile: true}\n")
    assert load_suite(path).fidelity_spec("cpu").compile_mode == "default"
    runs = run_fidelity(path, device="cpu", results_dir=tmp_path / "results")
    row = runs.iloc[0]
    assert row.status == "ok" and row.compile_mode == "default" and row.test_accuracy > 0.3


def test_shipped_suites_compile_cases():
    # part 1 on a GPU is the main job (suites/resnet50.yaml), eager; its suite file is the CPU stand-in
    part1 = load_suite(ROOT / "suites" / "gpu_check_part1.yaml")
    assert not any(c.compiled for device in ("cuda", "cpu") for c in part1.cases(device))
    # part 2: GPT-2 small compiled, amp_bf16 beside fp8, each with a cold compile's deadline; explain eager
    part2 = load_suite(ROOT / "suites" / "gpu_check_part2.yaml")
    assert [(c.case_id, c.timeout_s) for c in part2.cases("cuda") if c.compiled] == [
        ("gpt2-small-bs256-seq128-amp_bf16-compiled", 300), ("gpt2-small-bs256-seq128-fp8-compiled", 300)]
    assert not any(c.compiled for c in part2.cases("cpu"))
    suite = load_suite(ROOT / "suites" / "compile.yaml")
    modes = {c.compile_mode for c in suite.cases("cuda")}
    assert modes == {"eager", "default", "reduce-overhead"}
    assert {c.compile_mode for c in suite.cases("cpu")} == {"eager", "default"}


def test_compile_flag_alone_means_the_default_mode(write_suite):
    """`run --compile` alone is `compile: true` (the default mode), as in YAML; repeated it is an axis."""
    from amp_bench.cli import build_parser
    path = write_suite(MODELS + SETTINGS)
    alone = build_parser().parse_args(["run", str(path), "--compile"]).compile
    assert alone == ["true"]
    assert {c.compile_mode for c in load_suite(path).cases("cpu", {"compile": alone})} == {"default"}
    axis = build_parser().parse_args(["run", str(path), "--compile", "false", "--compile"]).compile
    assert {c.compile_mode for c in load_suite(path).cases("cpu", {"compile": axis})} == {"eager", "default"}


def test_compiled_cases_take_their_own_timeout(write_suite):
    """compile_timeout_s: the deadline of a compiled case (fp8, compiled by default, included) covers
    a cold compile; eager cases keep timeout_s."""
    text = ("models:\n  - {ref: 'python:toy_models:mlp', label: mlp}\nbatch_sizes: [4]\n"
            "precisions: [fp32, amp_bf16, fp8]\ntimeout_s: 60\ncompile_timeout_s: 300\n"
            "compile: [false, true]\ncompile_precisions: [amp_bf16, fp8]\n")
    cases = {c.case_id: c.timeout_s for c in load_suite(write_suite(text)).cases("cpu")}
    assert cases == {"mlp-bs4-fp32": 60, "mlp-bs4-amp_bf16": 60, "mlp-bs4-amp_bf16-compiled": 300,
                     "mlp-bs4-fp8-compiled": 300}
    plain = load_suite(write_suite(text.replace("compile_timeout_s: 300\n", ""), "plain.yaml")).cases("cpu")
    assert {c.timeout_s for c in plain} == {60}
