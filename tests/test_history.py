"""History: series keyed by case and fingerprint, persistent changes found, annotations accepted."""
import sys

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.gate.changepoints import detect, state
from amp_bench.analysis.gate.history import alerts, analyse, evaluate, load_annotations
from amp_bench.errors import UserError
from amp_bench.store.results import RunStore
from conftest import ROOT, amp_bench_cli


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


def test_state_goes_red_and_green_again():
    """The alarm is the current state: red while the latest level is worse, green once it is back."""
    rng = np.random.default_rng(4)
    values = rng.normal(100, 1, 30)
    values[20:26] *= 1.08  # a regression, fixed at night 26
    assert not state(values[:20]).red
    red = state(values[:23])
    assert red.red and red.start == 20 and red.ratio == pytest.approx(1.08, abs=0.02)
    assert not state(values[:28]).red and not state(values).red
    spike = rng.normal(100, 1, 30)
    spike[20] *= 1.3
    assert not any(state(spike[:i]).red for i in range(6, 31))
    # detect still dates both changes in the whole history
    assert [c.index for c in detect(values)] == [20, 26]


def test_state_weighs_a_shared_machines_slow_nights():
    """The same nights: five slow nights (+4%) on a machine that had seven before are not red (the
    pooled sd holds its slow nights), a 3% step after them is red within 5 nights, dated to it."""
    rng = np.random.default_rng(7)
    base = 100 * np.exp(rng.normal(0, 0.011, 30))
    slow = np.zeros(30, bool)
    slow[[2, 5, 6, 9, 13, 16, 17]] = True
    slow[25:] = True
    shared = base * np.where(slow, 1.04, 1.0)
    assert not any(state(shared[:i]).red for i in range(6, 31))
    step = base.copy()
    step[20:] *= 1.03
    assert not any(state(step[:i]).red for i in range(6, 21))
    red = state(step[:25])
    assert red.red and red.earliest <= 20 <= red.start and red.ratio == pytest.approx(1.03, abs=0.01)


def test_detection_rates_meet_the_targets():
    """The same figures benchmarks/nightly_targets.py prints, on fewer trials."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from nightly_targets import detection_rates
    # seeded: the same series every run; only the rates asserted below are judged (the same figures)
    r = detection_rates(60, seed=11, only={"step10_within_2", "step5_within_3", "noise_ever_red",
                                           "fixed_green_within_2"})
    assert r["step10_within_2"] == 1.0 and r["step5_within_3"] >= 0.9
    assert r["noise_ever_red"] <= 0.01 and r["fixed_green_within_2"] >= 0.9


def nightly(root, values, fingerprint="fp-a", case="resnet50-bs8-224px-amp_bf16", memory=None, contended=()):
    for night, value in enumerate(values):
        busy = {"contended": True, "contention": "load 3.2 on 2 cores"} if night in contended else {}
        store = RunStore(root, f"202611{night + 1:02d}T020000Z-node-{fingerprint}")
        store.add({"run_id": store.run_id, "case_id": case, "status": "ok", "device": "cpu",
                   "fingerprint": fingerprint, "timestamp": f"2026-11-{night + 1:02d}T02:00:00+00:00",
                   "hostname": "node", "suite": "resnet50",
                   "step_time_ms_median": value, "throughput": 8000 / value, "batch_size": 8,
                   "peak_rss_bytes": (memory or [1e9] * len(values))[night], **busy}, [])


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
    assert {(s.metric, s.since_run) for s in evaluate(results).red} == {
        ("step_time_ms", change.run_id), ("throughput", change.run_id)}
    annotations = load_annotations(write(tmp_path / "a.yaml", f"- {{run: {change.run_id}, note: new driver}}\n"))
    accepted = evaluate(results, annotations)
    assert alerts(accepted.changes) == [] and all(c.accepted for c in accepted.changes)
    assert accepted.red == [] and accepted.warnings == []


def write(path, text):
    path.write_text(text)
    return path


def test_annotations_as_people_write_them(tmp_path):
    """A glob, a date range with a window, a machine by host name; a mistyped one is named."""
    rng = np.random.default_rng(8)
    values = list(rng.normal(800, 4, 12)) + list(rng.normal(880, 4, 5))  # +10% from night 13
    nightly(tmp_path / "results", values)
    from amp_bench import load_results
    results = load_results(tmp_path / "results")
    assert evaluate(results).red
    for text in ("- {run: '2026111[23]T*', note: driver}\n",  # glob naming the change night (or the one before)
                 "- {from: 2026-11-11, window: 3, machine: node, suite: '*', note: range}\n",  # 2 nights early
                 "- {from: 2026-11-13, case: 'resnet50-*', metric: step_time_ms, note: m}\n"
                 "- {from: 2026-11-13, case: 'resnet50-*', metric: throughput, note: t}\n"):
        result = evaluate(results, load_annotations(write(tmp_path / "a.yaml", text)), annotations_path="a.yaml")
        assert result.red == [] and result.warnings == [], text
    late = "- {from: 2026-11-01, window: 3, name: too-early, note: x}\n- {run: 2026113*, name: typo, note: y}\n"
    result = evaluate(results, load_annotations(write(tmp_path / "a.yaml", late)), annotations_path="a.yaml")
    assert len(result.red) == 2 and len(result.warnings) == 2
    assert "'too-early' matched nothing" in result.warnings[0] and "'typo' matched nothing: run" in result.warnings[1]
    wrong_machine = "- {run: '2026111[23]T*', machine: other-host, note: x}\n"
    assert evaluate(results, load_annotations(write(tmp_path / "a.yaml", wrong_machine))).red


def test_series_never_mix_machines(tmp_path):
    nightly(tmp_path / "results", [800] * 8, fingerprint="fp-a")
    nightly(tmp_path / "results", [880] * 8, fingerprint="fp-b")  # another machine, 10% slower
    from amp_bench import load_results
    result = evaluate(load_results(tmp_path / "results"))
    assert result.changes == [] and result.red == [] and set(result.series.fingerprint) == {"fp-a", "fp-b"}


def test_annotations_file_errors(tmp_path):
    path = tmp_path / "annotations.yaml"
    path.write_text("- {run: r1, note: ok, metrc: step_time_ms}\n- {note: missing run}\n")
    with pytest.raises(UserError) as info:
        load_annotations(path)
    assert len(info.value.lines) == 2 and "[0].metrc: unknown key" in info.value.lines[0]
    assert "[1].run: missing" in info.value.lines[1]
    path.write_text("- {from: 'last tuesday', note: x}\n")
    with pytest.raises(UserError, match=r"\[0\]\.from: expected a date"):
        load_annotations(path)


def test_history_cli_exit_codes(tmp_path):
    rng = np.random.default_rng(5)
    nightly(tmp_path / "results", list(rng.normal(800, 4, 10)) + [900, 905, 898])
    proc = amp_bench_cli("history", tmp_path / "results", "-o", tmp_path / "h", env={"COLUMNS": "200"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # one case on one machine: one series, red in step time and throughput; header and summary agree
    assert "regression" in proc.stdout and "1 red series (2 red metrics)" in proc.stdout
    assert "1 series over" in proc.stdout
    markdown = (tmp_path / "h.md").read_text()
    assert markdown.startswith("# amp_bench history: 1 red series (2 red metrics)") and "\n1 series, " in markdown
    assert "| regression | no |" in markdown and (tmp_path / "h.json").exists()
    run_id = pd.read_json(tmp_path / "h.json", typ="series")["changes"][0]["run_id"]
    (tmp_path / "results" / "annotations.yaml").write_text(f"- {{run: {run_id}, note: intended}}\n")
    accepted = amp_bench_cli("history", tmp_path / "results", "-o", tmp_path / "h", env={"COLUMNS": "200"})
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted" in accepted.stdout and "0 red series (0 red metrics)" in accepted.stdout


def test_report_draws_the_history(tmp_path):
    from amp_bench.report import build_report
    rng = np.random.default_rng(9)
    nightly(tmp_path / "results", list(rng.normal(800, 4, 10)) + [900, 905, 898])
    html = build_report([tmp_path / "results"], tmp_path / "r.html")["html"].read_text()
    assert 'id="chart-history"' in html and "confirmed change" in html


def test_contended_runs_are_not_points_of_a_series(tmp_path):
    """Contended nights are left out of the series and listed; results without the column
    behave as before."""
    from amp_bench.analysis.gate.history import to_json, to_markdown
    from amp_bench.store.cache import load_tree
    rng = np.random.default_rng(6)
    values = list(rng.normal(800, 4, 14))
    values[6] = values[7] = values[8] = values[13] = 960  # +20% on four nights, all of them contended
    nightly(tmp_path / "results", values, contended=(6, 7, 8, 13))
    result = evaluate(load_tree(tmp_path / "results"))
    assert len(result.series) == 10 and 960 not in set(result.series["step_time_ms"])
    assert result.changes == [] and not result.red
    assert list(result.contended["run_id"].str[:8]) == ["20261107", "20261108", "20261109", "20261114"]
    assert list(result.contended["latest"]) == [False, False, False, True]
    md = to_markdown(result)
    assert "## Contended runs: not judged" in md and "tonight's run was contended: not judged" in md
    assert "load 3.2 on 2 cores" in to_json(result)
    proc = amp_bench_cli("history", tmp_path / "results", "-o", tmp_path / "h")
    assert proc.returncode == 0 and "tonight's run was contended: not judged" in proc.stdout, proc.stdout + proc.stderr
    # the same tree without the column: the slow nights are points again
    for path in (tmp_path / "results").glob("*/results.csv"):
        table = pd.read_csv(path)
        table.drop(columns=["contended", "contention"], errors="ignore").to_csv(path, index=False)
    again = evaluate(load_tree(tmp_path / "results", use_cache=False))
    assert len(again.series) == 14 and again.contended.empty
