"""`explain SUITE` and `run --explain` through the CLI on this CPU: real workers, one profiled step per
case after its window; a suite with nothing to explain says so per case and exits non-zero."""
import re

import pandas as pd
import pytest

import conftest
from amp_bench.cli import build_parser
from amp_bench.store.results import EXPLAIN_COLUMNS
from conftest import ROOT


def amp_bench_cli(*args):
    """The command run in this process (its workers are forked as from a command's): no second interpreter
    importing the CLI's libraries."""
    return conftest.amp_bench_cli(*args, env={"COLUMNS": "200"})


def test_the_suite_key_and_the_run_flag():
    from amp_bench.suite import load_suite
    assert build_parser().parse_args(["run", "suites/smoke.yaml", "--explain"]).explain is True
    assert build_parser().parse_args(["run", "suites/smoke.yaml", "--no-explain"]).explain is False
    assert build_parser().parse_args(["run", "suites/smoke.yaml"]).explain is None  # the suite's own setting
    suite = load_suite(ROOT / "suites" / "smoke.yaml")
    assert all(case.explain for case in suite.cases("cpu"))  # on by default
    assert not any(case.explain for case in suite.cases("cpu", {"explain": False}))


def test_nothing_to_explain_is_one_line_per_case_and_exit_3(tmp_path):
    proc = amp_bench_cli("explain", "suites/smoke.yaml", "--device", "cpu", "--precision", "tf32",
                         "--results-dir", str(tmp_path), "--no-report", "--target", "none")  # no GPU predictions
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("not explained: ")]
    assert len(lines) == 2 and all("unsupported: TF32 is a CUDA tensor-core mode" in line for line in lines)
    assert "nothing to explain" in proc.stdout


@pytest.mark.slow
def test_explain_smoke_on_cpu(tmp_path):
    # --allow-emulated: on a CPU without AVX512-BF16/AMX bf16 is emulated and gated; the breakdown
    # and its sentence must hold there too (named emulated), not only on a CPU with the instructions
    # the smoke suite's ResNet-18 at batch 2, 16 px, one warmup step: emulated bf16 costs ~10x a step (a
    # transformer's explained step is the GPU check's part 2 smoke, tests/test_gpu_check.py)
    suite = tmp_path / "small.yaml"
    text = (ROOT / "suites" / "smoke.yaml").read_text().replace("warmup_steps: 2", "warmup_steps: 1")
    text = re.sub(r"  - ref: transformers/gpt2\n(    .*\n)+", "", text)
    suite.write_text(text.replace("image_size: 32", "image_size: 16"))
    proc = amp_bench_cli("explain", str(suite), "--device", "cpu", "--precision", "fp32", "--precision",
                         "amp_bf16", "--steps", "3", "--batch-size", "2", "--allow-emulated", "--repeats", "1",
                         "--target", "none", "--results-dir", str(tmp_path / "results"),
                         "--reports-dir", str(tmp_path / "reports"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    run_dir = next((tmp_path / "results").iterdir())
    table = pd.read_csv(run_dir / "results.csv")
    assert set(EXPLAIN_COLUMNS) <= set(table.columns)
    ok = table[table["status"] == "ok"]
    assert len(ok) >= 2 and ok["explain_status"].isin(["ok", "distorted"]).all(), ok["explain_reason"].tolist()
    for _, row in ok.iterrows():
        assert (run_dir / row["explain_trace"]).exists()  # relative to the run directory
        assert row["explain_other_share"] < 0.10
    assert "Where the profiled step's time went" in proc.stdout
    emulated = bool(table.loc[table["precision"] == "amp_bf16", "emulated"].astype(str).eq("True").any())
    mode = "amp_bf16 (emulated)" if emulated else "amp_bf16"
    text = " ".join(proc.stdout.split())
    # a change is called only beyond its noise: either wording, never a category called changed inside it
    # (ResNet-18's one GEMM, its classifier, is under 1% of a 16 px step at times: then "conv" alone)
    assert re.search(rf"resnet18 bs 2 16px: ({re.escape(mode)} made|under {re.escape(mode)} (GEMM\+)?conv did not "
                     "change)", text), text
    assert "ceiling" in text
    html = next((tmp_path / "reports").glob("*.html")).read_text()
    assert "chart-explain" in html and "Where the time goes" in html


DDP_EXPLAIN_SUITE = """
models: [python:toy_models:mlp]
batch_sizes: [8]
precisions: [fp32]
nproc_per_node: 2
threads_per_rank: 1
warmup_steps: 2
steps: 6
timeout_s: 180
explain: true
"""


@pytest.mark.slow
def test_ddp_profiled_steps_sync_gradients_so_communication_is_real(write_suite, tmp_path):
    """Under DDP the profiled steps all-reduce the gradients (every rank runs them,
    the group's timeout cut for their duration): 2 gloo ranks on this CPU, a non-zero communication
    category and gloo's all-reduce in the saved trace."""
    import amp_bench
    results = amp_bench.run_suite(write_suite(DDP_EXPLAIN_SUITE), device="cpu", results_dir=tmp_path / "results")
    row = results.iloc[0]
    assert row["status"] == "ok" and row["world_size"] == 2, row["reason"]
    assert row["explain_status"] in ("ok", "distorted"), row["explain_reason"]
    assert row["explain_communication_ms"] > 0 and row["explain_profiled_steps"] == 3
    run_dir = next((tmp_path / "results").iterdir())
    import gzip
    import json
    with gzip.open(run_dir / row["explain_trace"], "rt") as fh:
        names = {e.get("name", "") for e in json.load(fh)["traceEvents"]}
    assert any("allreduce" in n.lower() or "all_reduce" in n.lower() for n in names)
