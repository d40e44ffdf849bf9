"""The CLI end to end on this CPU: the smoke suite, env, list-models, bad options."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from amp_bench.store.results import RESULT_COLUMNS
from conftest import ROOT, native_on_this_cpu


def amp_bench_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "amp_bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "COLUMNS": "160"})


@pytest.mark.slow
def test_smoke_suite_end_to_end_on_cpu(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    run_dir = next((out / "results").iterdir())
    assert run_dir.name.endswith("-cpu") and run_dir.name[:8].isdigit()
    table = pd.read_csv(run_dir / "results.csv")
    assert list(table.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    by_case = table.set_index(["model_label", "precision"]).status.to_dict()
    assert set(table.loc[table.status == "ok", "cpu_allocator"]) == {"system"}  # --cpu-allocator system
    bf16 = native_on_this_cpu("amp_bf16")  # without AVX512-BF16/AMX the gate leaves emulated bf16 out
    for model in ("resnet18", "gpt2-tiny"):
        assert by_case[model, "fp32"] == "ok" and by_case[model, "amp_bf16"] == ("ok" if bf16 else "unsupported")
        assert by_case[model, "tf32"] == "unsupported"
        assert by_case[model, "amp_fp16"] in ("ok", "unsupported")  # ok only on CPUs with native fp16
    gpt2 = table[(table.model_label == "gpt2-tiny") & (table.precision == "amp_bf16")].iloc[0]
    if bf16:
        assert gpt2.model_attn_implementation == "sdpa" and gpt2.model_task == "causal-lm"
        assert gpt2.output_dtype == "bfloat16"
    else:  # not run, and how much slower it would be here, measured on the model's largest layer
        assert "emulated" in gpt2.reason and "allow_emulated" in gpt2.reason and gpt2.emulated
        assert "slower than fp32, forward and backward (measured)" in gpt2.reason
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["suite"]["sha256"] and manifest["versions"]["torch_version"]
    assert (run_dir / "suite.yaml").read_text() == (ROOT / "suites" / "smoke.yaml").read_text()
    assert "resnet18 on " in proc.stdout and "gpt2-tiny on " in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "vs fp32" in line)
    assert header.split() == ["bs", "precision", "ms/step", "samples/s", "vs", "fp32", "peak", "RSS", "saved", "saved*"]
    if bf16:
        bf16_rows = [line.split() for line in proc.stdout.splitlines() if line.split()[1:2] == ["amp_bf16"]]
        assert len(bf16_rows) == 2 and all(row[4].endswith("x") and row[-1].endswith("%") for row in bf16_rows)
        assert "bf16 autocast is" in proc.stdout  # the headline
    else:
        assert "bf16 autocast not run" in proc.stdout
    # on a machine without a GPU, the run ends with what its suite's GPU cases would give on GPUs, predicted
    ending = proc.stdout.split("On GPUs (predicted, nothing measured here)", 1)[1]
    assert all(gpu in ending for gpu in ("V100 SXM2", "A100 SXM 80GB", "L4", "H100 SXM 80GB"))
    assert "Predicted, nothing measured on a GPU" in " ".join(ending.split()) and (run_dir / "predicted.csv").is_file()
    # and with the changes those GPU cases could take, priced per GPU (smoke's resnet18 trains NCHW, foreach SGD)
    gpus = " ".join(proc.stdout.split("advice on GPUs (predicted from fake-tensor steps", 1)[1].split())
    assert "use the fused sgd (fused=True) (optimizer_impl): " in gpus and "channels_last" in gpus
    assert all(f"on {gpu}" in gpus for gpu in ("V100 SXM2", "A100 SXM 80GB", "L4", "H100 SXM 80GB"))
    assert (run_dir / "predicted_advice.csv").is_file()
    # the run wrote its report and said where
    report = out / "reports" / f"{run_dir.name}.html"
    assert f"report: {report}" in proc.stdout.replace("\n", "")
    for suffix in (".md", ".summary.csv", ".claims.csv", ".environment.csv", ".not_measured.csv"):
        assert report.with_suffix("").with_name(report.stem + suffix).exists(), suffix


def test_report_command_on_a_real_cpu_run(smoke_run, tmp_path):
    _, out = smoke_run
    proc = amp_bench_cli("report", str(out / "results"), "-o", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / "r.html").read_text()
    assert "The claims, checked" in html and "plotly" in html
    assert "<script src=\"http" not in html and "cdn.plot.ly/plotly" not in html  # plotly.js is inline
    md = (tmp_path / "r.md").read_text()
    bf16 = native_on_this_cpu("amp_bf16")
    assert ("| gpt2-tiny | 4 | amp_bf16 | ok |" if bf16
            else "| gpt2-tiny | 4 | amp_bf16 (emulated) | unsupported |") in md
    claims = pd.read_csv(tmp_path / "r.claims.csv")
    assert set(claims.baseline) == {"fp32"}  # no tf32 on a CPU, so no tf32 rows
    # a verdict on a contended or emulated figure carries its qualifier: "below (contended: ...)"
    verdicts = {v.split(" ")[0] for v in claims[claims.precision == "amp_bf16"].speedup_verdict}
    assert verdicts <= ({"below", "within", "above"} if bf16 else {"unsupported"})
    md_only = amp_bench_cli("report", str(out / "results"), "-o", str(tmp_path / "m.html"), "--format", "md")
    assert md_only.returncode == 0 and (tmp_path / "m.md").exists() and not (tmp_path / "m.html").exists()


@pytest.mark.parametrize("args, message", [
    (["report", "nope/"], "nope: no such results directory"),
    (["report", "suites/"], "no results.csv found"),
    (["report", "suites/", "--format", "pdf"], "--format: expected a comma-separated list"),
])
def test_report_bad_input(args, message):
    proc = amp_bench_cli(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_env_reports_modes_and_reasons():
    proc = amp_bench_cli("env", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    for mode in ("fp32", "tf32", "amp_fp16", "amp_bf16"):
        assert mode in proc.stdout
    assert "the CPU has no TF32" in proc.stdout


def test_list_models():
    proc = amp_bench_cli("list-models")
    assert proc.returncode == 0, proc.stderr
    assert "resnet50" in proc.stdout and "gpt2" in proc.stdout and "bert" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "suites/smoke.yaml", "--batch-size", "0"], "--batch-size: expected a batch size"),
    (["run", "suites/smoke.yaml", "--precision", "fp4"], "--precision: expected one of"),
    (["run", "suites/nope.yaml"], "suites/nope.yaml: suite file not found"),
    (["run", "suites/smoke.yaml", "--device", "cuda:x"], "expected cuda or cuda:N"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path):
    proc = amp_bench_cli(*args, "--results-dir", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing half-created


def test_cuda_without_gpu_is_a_clear_error(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = amp_bench_cli("run", "suites/smoke.yaml", "--device", "cuda", "--results-dir", str(tmp_path))
    assert proc.returncode == 2 and "no CUDA device is available" in proc.stderr


def test_report_images_without_an_exporter_say_so(smoke_run, tmp_path):
    pytest.importorskip("plotly")
    try:
        import kaleido  # noqa: F401
        pytest.skip("kaleido is installed here: images would be written")
    except ImportError:
        pass
    _, out = smoke_run
    proc = amp_bench_cli("report", str(out / "results"), "-o", str(tmp_path / "r.html"), "--images", "png")
    assert proc.returncode == 0, proc.stderr
    assert "static png images skipped" in proc.stdout and "pip install kaleido" in proc.stdout
    assert (tmp_path / "r.html").exists()


def test_run_without_plotly_keeps_results_and_skips_the_report(tmp_path, monkeypatch):
    import sys

    from rich.console import Console

    from amp_bench.cli.run import auto_report as _auto_report
    monkeypatch.setitem(sys.modules, "plotly", None)  # as on a GPU image without plotly
    console = Console(record=True, width=200)
    _auto_report(str(tmp_path / "run"), tmp_path / "reports", console)
    assert "report skipped: plotly is not installed" in console.export_text()
    assert not (tmp_path / "reports").exists()
