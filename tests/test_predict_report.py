"""The report's "What other GPUs would give" section: written for a run whose suite asks for
predictions, absent (with how to get it) otherwise, and drawn by a real browser offline."""
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
    written = build_report([cpu_run], tmp_path / "report.html")
    page = written["html"].read_text()
    assert "<h2 id='predict'>What other GPUs would give</h2>" in page
    section = page.split("<h2 id='predict'>", 1)[1].split("<h2 id=", 1)[0]
    assert all(gpu in section for gpu in ("H100 SXM 80GB", "A100 SXM 80GB", "L4", "V100 SXM2"))
    assert "unsupported: bf16 needs compute capability &gt;= 8.0" in section
    assert "op inventory from a CPU run" in section and "No GPU-sourced AMP prediction has been scored" in section
    assert 'id="chart-predict"' in section
    markdown = written["md"].read_text()
    assert "## What other GPUs would give" in markdown and "| resnet18 bs 4 32px | L4 | amp_bf16 |" in markdown
    table = written["csv_predict"].read_text().splitlines()
    assert table[0].startswith("case,precision,target") and len(table) == 1 + 4 * 4


def test_without_a_predict_block_the_section_says_how_to_ask_for_it(cpu_run, tmp_path):
    (cpu_run / "suite.yaml").write_text("models: [torchvision/resnet18]\nbatch_sizes: [4]\n")
    page = build_report([cpu_run], tmp_path / "report.html")["html"].read_text()
    section = page.split("<h2 id='predict'>", 1)[1].split("<h2 id=", 1)[0]
    assert "No run here asked for predictions" in section and "chart-predict" not in section


def test_a_run_that_cannot_be_predicted_says_why_in_one_line(cpu_run, tmp_path):
    (cpu_run / "suite.yaml").write_text("predict:\n  targets: [h100-sxm, b300]\n")
    page = build_report([cpu_run], tmp_path / "report.html")["html"].read_text()
    assert "not predicted" in page and "predict.targets[1]: unknown GPU &#x27;b300&#x27;" in page
