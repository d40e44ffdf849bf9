"""The HTML report in a real headless browser with networking off: every chart draws, and the page
asks for nothing outside the file."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fake_results import write_gpu_fleet, write_machine_runs, write_study_runs

from amp_bench.report import build_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI") != "true":  # .ci/run installs it; a laptop may lack it
    pytest.skip("Debian's chromium is not installed (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow


def render(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """DOM after scripts ran, and every URL the page itself requested that is not part of the file."""
    assert CHROMIUM, "chromium is required in CI"
    netlog = tmp_path / "netlog.json"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
         "--host-resolver-rules=MAP * ~NOTFOUND", f"--log-net-log={netlog}", "--virtual-time-budget=20000",
         "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = netlog.read_text()
    try:
        log = json.loads(text)
    except ValueError:  # the log is closed lazily; a killed browser leaves the list open
        log = json.loads(text.rstrip().rstrip(",") + "]}")
    requests = []
    for event in log.get("events", []):
        params = event.get("params") or {}
        url = params.get("url", "")
        # requests the page made carry its file:// isolation key; Chromium's own chatter does not
        if url and "file://" in str(params.get("network_isolation_key", "")) and not url.startswith(
                ("file:", "data:", "blob:", "about:")):
            requests.append(url)
    return proc.stdout, sorted(set(requests))


def report_charts(tmp_path: Path) -> tuple[str, list[str]]:
    """Report of tmp_path/results rendered offline: (DOM, chart ids); the page fetched nothing."""
    written = build_report([tmp_path / "results"], tmp_path / "report.html")
    dom, requests = render(written["html"], tmp_path)
    assert requests == []
    return dom, re.findall(r'<div id="chart-([a-z0-9-]+)"', dom)


def assert_every_chart_drew(dom: str, charts: list[str]) -> None:
    for chart in charts:
        body = dom.split(f'<div id="chart-{chart}"', 1)[1].split('<div id="chart-', 1)[0]
        assert 'class="main-svg"' in body, f"chart {chart} did not draw"
        assert "<path" in body or "<rect" in body, f"chart {chart} drew no marks"


def test_detector_catches_outside_requests(tmp_path):
    page = tmp_path / "leaky.html"
    page.write_text('<html><body><img src="http://example.invalid/p.png">'
                    '<script>fetch("https://cdn.example.invalid/x.js").catch(() => {})</script></body></html>')
    _, requests = render(page, tmp_path)
    assert requests == ["http://example.invalid/p.png", "https://cdn.example.invalid/x.js"]


def test_every_chart_draws_offline_and_nothing_is_fetched(tmp_path):
    write_machine_runs(tmp_path / "results")
    dom, charts = report_charts(tmp_path)
    # two machines with per-phase memory and scaler skips: every chart of the report has data
    assert set(charts) == {"speedup", "speedup-tf32", "memory", "phases", "throughput", "distributions",
                           "scaler", "machines"}
    assert_every_chart_drew(dom, charts)


def test_fidelity_and_headroom_charts_draw_offline(tmp_path):
    write_study_runs(tmp_path / "results")
    dom, charts = report_charts(tmp_path)
    assert set(charts) == {"fidelity", "loss-scale", "headroom"}
    assert_every_chart_drew(dom, charts)
    assert "Speedup over FP32" not in dom  # no benchmark rows: no empty benchmark sections
    assert "parity" in dom and "2.11x" in dom


def test_gpus_compared_draws_offline_with_unsupported_modes_as_crosses(tmp_path):
    """A V100, an A100, an L4 and an H100 as partitions: the section's chart draws, and the modes a GPU
    lacks are labelled crosses (bf16 on the V100, fp8 below Ada), not bars of zero."""
    write_gpu_fleet(tmp_path / "results")
    dom, charts = report_charts(tmp_path)
    assert "machines" in charts
    assert_every_chart_drew(dom, charts)
    section = dom.split('id="machines"', 1)[1].split("<h2", 1)[0]
    assert "GPUs compared" in dom and "NVIDIA L4 (Ada) [l4]" in section
    assert "not supported here: fp8 needs compute capability" in section
    chart = dom.split('<div id="chart-machines"', 1)[1].split('<div id="chart-', 1)[0]
    assert chart.count("not supported") >= 4  # V100 tf32, bf16, fp8 and A100 fp8, drawn as labelled crosses
