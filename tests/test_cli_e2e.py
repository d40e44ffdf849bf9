"""The CLI end to end on this CPU: the smoke suite, env, list-models, bad options."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from amp_bench.results import RESULT_COLUMNS
from conftest import ROOT


def amp_bench_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "amp_bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "COLUMNS": "160"})


@pytest.mark.slow
def test_smoke_suite_end_to_end_on_cpu(tmp_path):
    proc = amp_bench_cli("run", "suites/smoke.yaml", "--device", "cpu", "--results-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    run_dir = next(tmp_path.iterdir())
    assert run_dir.name.endswith("-cpu") and run_dir.name[:8].isdigit()
    table = pd.read_csv(run_dir / "results.csv")
    assert list(table.columns[: len(RESULT_COLUMNS)]) == RESULT_COLUMNS
    by_case = table.set_index(["model_label", "precision"]).status.to_dict()
    for model in ("resnet18", "gpt2-tiny"):
        assert by_case[model, "fp32"] == "ok" and by_case[model, "amp_bf16"] == "ok"
        assert by_case[model, "tf32"] == "unsupported"
        assert by_case[model, "amp_fp16"] in ("ok", "unsupported")  # ok only on CPUs with native fp16
    gpt2 = table[(table.model_label == "gpt2-tiny") & (table.precision == "amp_bf16")].iloc[0]
    assert gpt2.model_attn_implementation == "sdpa" and gpt2.model_task == "causal-lm"
    assert gpt2.output_dtype == "bfloat16"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["suite"]["sha256"] and manifest["versions"]["torch_version"]
    assert (run_dir / "suite.yaml").read_text() == (ROOT / "suites" / "smoke.yaml").read_text()
    assert "resnet18 on " in proc.stdout and "gpt2-tiny on " in proc.stdout
    header = next(line for line in proc.stdout.splitlines() if "vs fp32" in line)
    assert header.split() == ["bs", "precision", "ms/step", "samples/s", "vs", "fp32", "peak", "RSS", "saved", "saved*"]
    bf16_rows = [line.split() for line in proc.stdout.splitlines() if line.split()[1:2] == ["amp_bf16"]]
    assert len(bf16_rows) == 2 and all(row[4].endswith("x") and row[-1].endswith("%") for row in bf16_rows)


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
    (["run", "suites/smoke.yaml", "--batch-size", "0"], "override.batch_sizes[0]: expected a batch size"),
    (["run", "suites/smoke.yaml", "--precision", "fp8"], "override.precisions[0]: expected one of"),
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
