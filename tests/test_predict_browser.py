"""The predictions chart in a real headless browser, networking off (the pattern of test_report_browser)."""
import shutil
from pathlib import Path

from test_report_browser import assert_every_chart_drew, render  # skips this module without chromium

from amp_bench.report import build_report

DATA = Path(__file__).resolve().parent / "data" / "predict"


def test_the_predictions_chart_draws_offline(tmp_path):
    shutil.copytree(DATA / "cpu_run", tmp_path / "results" / "cpu_run")
    written = build_report([tmp_path / "results" / "cpu_run"], tmp_path / "report.html")
    dom, requests = render(written["html"], tmp_path)
    assert requests == []
    assert_every_chart_drew(dom, ["predict"])
    assert "What other GPUs would give" in dom and "V100 SXM2" in dom
