"""The report's "On GPUs (predicted, nothing measured here)" section: a run made without a GPU brings what
it predicted for its suite's GPU cases (predicted.csv); a run with nothing predicted says how to get it."""
import shutil
from pathlib import Path

import pytest

from amp_bench.report import build_report

DATA = Path(__file__).resolve().parent / "data" / "predict"


@pytest.fixture
def cpu_run(tmp_path) -> Path:
    run = tmp_path / "results" / "cpu_run"
    shutil.copytree(DATA / "cpu_run", run)
    return run


def test_the_section_shows_each_target_with_intervals_and_unsupported_modes(cpu_run, tmp_path):
    from amp_bench.studies.gpu_predictions import after_cpu_run
    assert after_cpu_run(cpu_run) is not None  # what the run's end writes: predicted.csv
    written = build_report([cpu_run], tmp_path / "report.html")
    page = written["html"].read_text()
    assert "<h2 id='predict'>On GPUs (predicted, nothing measured here)</h2>" in page
    section = page.split("<h2 id='predict'>", 1)[1].split("<h2 id=", 1)[0]
    assert all(gpu in section for gpu in ("H100 SXM 80GB", "A100 SXM 80GB", "L4", "V100 SXM2"))
    assert "unsupported: bf16 needs compute capability &gt;= 8.0" in section and "GiB" in section
    assert "recorded on fake tensors" in section and "Predicted, nothing measured on a GPU" in section
    assert 'id="chart-predict"' in section
    markdown = written["md"].read_text()
    assert "## On GPUs (predicted, nothing measured here)" in markdown
    assert "| resnet18 bs 4 32px | L4 | amp_bf16 |" in markdown
    table = written["csv_predict"].read_text().splitlines()
    assert table[0].startswith("case,precision,target") and len(table) == 1 + 2 * 4 * 4  # 2 cases, 4 GPUs, 4 modes


def test_with_nothing_predicted_the_section_says_how_to_get_it(cpu_run, tmp_path):
    (cpu_run / "suite.yaml").write_text("models: [torchvision/resnet18]\nbatch_sizes: [4]\n")
    page = build_report([cpu_run], tmp_path / "report.html")["html"].read_text()
    section = page.split("<h2 id='predict'>", 1)[1].split("<h2 id=", 1)[0]
    assert "Nothing predicted" in section and "chart-predict" not in section


def test_a_run_that_cannot_be_predicted_says_why_in_one_line(cpu_run, tmp_path):
    (cpu_run / "suite.yaml").write_text("predict:\n  targets: [h100-sxm, b300]\n")
    page = build_report([cpu_run], tmp_path / "report.html")["html"].read_text()
    assert "not predicted" in page and "predict.targets[1]: unknown GPU &#x27;b300&#x27;" in page
