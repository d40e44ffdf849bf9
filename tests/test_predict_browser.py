"""The predictions chart in a real headless browser, networking off (the pattern of test_report_browser)."""
import shutil
from pathlib import Path

from test_report_browser import assert_every_chart_drew, render  # skips this module without chromium

from amp_bench.report import build_report

DATA = Path(__file__).resolve().parent / "data" / "predict"


def test_the_predictions_chart_draws_offline(tmp_path):
    from amp_bench.studies.gpu_predictions import after_cpu_run
    run = tmp_path / "results" / "cpu_run"
    shutil.copytree(DATA / "cpu_run", run)
    assert after_cpu_run(run) is not None  # what a run without a GPU writes when it ends: predicted.csv
    written = build_report([run], tmp_path / "report.html")
    dom, requests = render(written["html"], tmp_path)
    assert requests == []
    assert_every_chart_drew(dom, ["predict"])
    assert "Predicted speedup on other GPUs" in dom and "V100 SXM2" in dom
