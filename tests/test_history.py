"""History: series keyed by case and fingerprint, persistent changes found, annotations accepted."""
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from amp_bench.changepoints import detect
from amp_bench.errors import UserError
from amp_bench.history import alerts, analyse, load_annotations
from amp_bench.results import RunStore
from conftest import ROOT


def test_detector_on_known_truth():
    rng = np.random.default_rng(0)
    step = rng.normal(100, 1, 40)
    step[20:] *= 1.05
    changes = detect(step)
    assert len(changes) == 1 and 20 <= changes[0].index <= 22 and changes[0].ratio == pytest.approx(1.05, abs=0.02)
    spike = rng.normal(100, 1, 40)
    spike[20] *= 1.3
    assert detect(spike) == []
    assert detect(rng.normal(100, 1, 200)) == []


def test_detection_rates_meet_the_targets():
    """The same figures benchmarks/changepoint_rates.py prints, on fewer trials."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from changepoint_rates import rates
    r = rates(300, seed=11)
    assert r["detection_within_2_runs"] >= 0.93  # >= 95% on 1000 trials; 300 trials wobble more
    assert r["false_alarms_per_run"] <= 0.01 and r["spike_alarms"] == 0


def nightly(root, values, fingerprint="fp-a", case="resnet50-bs8-224px-amp_bf16", memory=None):
    for night, value in enumerate(values):
        store = RunStore(root, f"202611{night + 1:02d}T020000Z-node-{fingerprint}")
        store.add({"run_id": store.run_id, "case_id": case, "status": "ok", "device": "cpu",
                   "fingerprint": fingerprint, "timestamp": f"2026-11-{night + 1:02d}T02:00:00+00:00",
                   "step_time_ms_median": value, "throughput": 8000 / value, "batch_size": 8,
                   "peak_rss_bytes": (memory or [1e9] * len(values))[night]}, [])


def test_a_slowdown_alerts_until_accepted(tmp_path):
    rng = np.random.default_rng(3)
    values = list(rng.normal(800, 5, 12)) + list(rng.normal(880, 5, 4))  # +10% from night 13
    nightly(tmp_path / "results", values)
    from amp_bench import load_results
    results = load_results(tmp_path / "results")
    series, changes = analyse(results)
    found = alerts(changes)
    assert {c.metric for c in found} == {"step_time_ms", "throughput"}
    change = next(c for c in found if c.metric == "step_time_ms")
    assert change.run_id.startswith("20261113") and change.ratio == pytest.approx(1.10, abs=0.02)
    annotations = [{"run": change.run_id, "note": "new driver, accepted"}]
    _, accepted = analyse(results, annotations)
    assert alerts(accepted) == [] and all(c.accepted for c in accepted)


def test_series_never_mix_machines(tmp_path):
    nightly(tmp_path / "results", [800] * 8, fingerprint="fp-a")
    nightly(tmp_path / "results", [880] * 8, fingerprint="fp-b")  # another machine, 10% slower
    from amp_bench import load_results
    series, changes = analyse(load_results(tmp_path / "results"))
    assert changes == [] and set(series.fingerprint) == {"fp-a", "fp-b"}


def test_annotations_file_errors(tmp_path):
    path = tmp_path / "annotations.yaml"
    path.write_text("- {run: r1, note: ok, metrc: step_time_ms}\n- {note: missing run}\n")
    with pytest.raises(UserError) as info:
        load_annotations(path)
    assert len(info.value.lines) == 2 and "[0].metrc: unknown key" in info.value.lines[0]
    assert "[1].run: missing" in info.value.lines[1]


def test_history_cli_exit_codes(tmp_path):
    rng = np.random.default_rng(5)
    nightly(tmp_path / "results", list(rng.normal(800, 4, 10)) + [900, 905, 898])
    cmd = [sys.executable, "-m", "amp_bench", "history", str(tmp_path / "results"), "-o", str(tmp_path / "h")]
    import os
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "regression" in proc.stdout and "2 alert(s)" in proc.stdout  # step time and throughput
    assert "| regression | no |" in (tmp_path / "h.md").read_text() and (tmp_path / "h.json").exists()
    run_id = pd.read_json(tmp_path / "h.json", typ="series")["changes"][0]["run_id"]
    (tmp_path / "results" / "annotations.yaml").write_text(f"- {{run: {run_id}, note: intended}}\n")
    accepted = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted" in accepted.stdout


def test_report_draws_the_history(tmp_path):
    from amp_bench.report import build_report
    rng = np.random.default_rng(9)
    nightly(tmp_path / "results", list(rng.normal(800, 4, 10)) + [900, 905, 898])
    html = build_report([tmp_path / "results"], tmp_path / "r.html")["html"].read_text()
    assert 'id="chart-history"' in html and "confirmed change" in html
