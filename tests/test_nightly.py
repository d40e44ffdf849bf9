"""nightly: one gate over a generated multi-machine tree, end to end through the CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from amp_bench.store.results import RunStore
from conftest import ROOT, amp_bench_cli

MACHINES = {"node-a": "fp-aaaa", "node-b": "fp-bbbb"}
SUITES = ("resnet50", "bert")


def write_night(root, night, rng, slow=None, skip=(), contended=()):
    """One night of two machines x two suites x two cases; slow: {(host, suite, case): factor};
    contended: (host, suite) whose run is marked contended (the `contended` column)."""
    for host, fp in MACHINES.items():
        for s, suite in enumerate(SUITES):
            store = RunStore(root, f"202612{night:02d}T02{s}000Z-{host}-cuda")
            store.flush_every_s = float("inf")  # the tables once a run, not after every row
            for c in range(2):
                case = f"{suite}-case{c}"
                if (host, suite, case) in skip:
                    continue
                factor = (slow or {}).get((host, suite, case), 1.0)
                for repeat in range(3):
                    ms = (40 + 10 * c) * factor * rng.normal(1, 0.004)
                    store.add({"run_id": store.run_id, "suite": suite, "case_id": case, "status": "ok",
                               "device": "cuda", "hostname": host, "fingerprint": fp, "repeat": repeat,
                               "timestamp": f"2026-12-{night:02d}T02:{s}0:00+00:00", "batch_size": 32,
                               "step_time_ms_median": ms, "throughput": 32e3 / ms,
                               "peak_mem_allocated_bytes": 2e9 + c,
                               **({"contended": True, "contention": "another job on the GPU"}
                                  if (host, suite) in contended else {})}, [])
            store.flush()


def run(*args):
    return amp_bench_cli(*args, env={"COLUMNS": "200"})


@pytest.fixture
def tree(tmp_path):
    rng = np.random.default_rng(12)
    root = tmp_path / "results"
    for night in range(1, 13):
        slow = {("node-b", "resnet50", "resnet50-case0"): 1.10} if night >= 10 else None
        write_night(root, night, rng, slow)
    return root


def test_nightly_gate_end_to_end(tree, tmp_path):
    out = tmp_path / "n"
    proc = run("nightly", tree, "-o", out, "--dashboard", tmp_path / "dash.html")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "n.json").read_text())
    assert report["exit_code"] == 1 and len(report["groups"]) == 4
    assert {(r["hostname"], r["case_id"], r["metric"]) for r in report["red"]} == {
        ("node-b", "resnet50-case0", "step_time_ms"), ("node-b", "resnet50-case0", "throughput")}
    assert all(r["since_date"] == "2026-12-10" for r in report["red"])
    assert 'failures="2"' in (tmp_path / "n.junit.xml").read_text()
    assert "| node-b (fp-bbbb) | resnet50 |" in (tmp_path / "n.md").read_text()
    page = (tmp_path / "dash.html").read_text()
    assert "RED +10" in page and page.index("resnet50-case0 @ node-b") < page.index("bert-case0 @ node-a")
    assert "Plotly.newPlot" in page and "<script src=" not in page  # self-contained
    # accept the new level for that machine and suite: green, and it stays green the next night
    accepted = run("nightly", tree, "--accept", "--machine", "node-b", "--suite", "resnet*", "--note", "new kernel",
                   "-o", out)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "accepted 20261212T020000Z-node-b-cuda for node-b / resnet50" in accepted.stdout
    write_night(tree, 13, np.random.default_rng(1), {("node-b", "resnet50", "resnet50-case0"): 1.10})
    assert run("nightly", tree, "-o", out).returncode == 0


def test_a_fixed_regression_goes_green(tree, tmp_path):
    for night in (13, 14):
        write_night(tree, night, np.random.default_rng(night))
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    changes = json.loads((tmp_path / "n.json").read_text())["changes"]
    assert {(c["date"], c["kind"]) for c in changes if c["metric"] == "step_time_ms"} == {
        ("2026-12-10", "regression"), ("2026-12-13", "improvement")}  # the past stays visible, with dates


def test_a_missing_case_is_no_verdict(tree, tmp_path):
    write_night(tree, 13, np.random.default_rng(3), skip={("node-a", "bert", "bert-case1")})
    (tree / "annotations.yaml").write_text("- {from: 2026-12-10, machine: node-b, note: known}\n")
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "bert-case1" in (tmp_path / "n.md").read_text()


def test_a_contended_run_is_not_judged(tree, tmp_path):
    """Tonight's run on node-a/bert was contended (and 20% slower): it is left out of the series and
    listed, that series has no verdict tonight (exit 3), not a regression; the others are judged."""
    (tree / "annotations.yaml").write_text("- {from: 2026-12-10, machine: node-b, note: known}\n")
    write_night(tree, 13, np.random.default_rng(3), slow={("node-a", "bert", "bert-case0"): 1.2},
                contended={("node-a", "bert")})
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "tonight's run was contended: not judged" in proc.stdout
    report = json.loads((tmp_path / "n.json").read_text())
    assert report["red"] == []
    busy = [g for g in report["groups"] if g["contended"]]
    assert [(g["hostname"], g["suite"], g["contended"], g["contention"]) for g in busy] == [
        ("node-a", "bert", ["bert-case0", "bert-case1"], "another job on the GPU")]
    assert all(not g["missing"] for g in report["groups"])
    assert {r["run_id"] for r in report["contended"]} == {"20261213T021000Z-node-a-cuda"}
    md = (tmp_path / "n.md").read_text()
    assert "## Contended tonight: not judged" in md and "another job on the GPU" in md
    assert 'skipped message="contended tonight' in (tmp_path / "n.junit.xml").read_text()
    # the next night is not contended: judged again, against a series that never saw the slow run
    write_night(tree, 14, np.random.default_rng(4))
    assert run("nightly", tree, "-o", tmp_path / "n").returncode == 0
    # --accept does not move a baseline onto a contended run
    write_night(tree, 15, np.random.default_rng(5), contended={("node-a", "bert")})
    refused = run("nightly", tree, "--accept", "--machine", "node-a", "--suite", "bert", "-o", tmp_path / "n")
    assert refused.returncode == 2 and "contended" in refused.stderr


def test_the_table_counts_cases_in_both_columns(tmp_path):
    """One machine, three cases, one of them 10% slower from night 10: red on step time and on
    throughput, which is one red case of three judged (the table once said series 3, red 6)."""
    from amp_bench.analysis.gate.nightly import nightly, to_json, to_markdown
    rng = np.random.default_rng(20)
    root = tmp_path / "results"

    def write(night, unsupported=("case-tf32",)):
        store = RunStore(root, f"202612{night:02d}T020000Z-node-a-cuda")
        store.flush_every_s = float("inf")  # the tables once a run, not after every row
        for c in ("case0", "case1", "case2", "case-tf32"):
            for repeat in range(3):
                row = {"run_id": store.run_id, "suite": "s", "case_id": c, "device": "cuda", "hostname": "node-a",
                       "fingerprint": "fp-aaaa", "repeat": repeat, "batch_size": 32,
                       "timestamp": f"2026-12-{night:02d}T02:00:00+00:00"}
                if c in unsupported:  # every night: this GPU has no such mode
                    store.add({**row, "status": "unsupported", "reason": "tf32 needs Ampere or newer"}, [])
                    continue
                ms = (40 + 10 * int(c[-1])) * (1.10 if c == "case0" and night >= 10 else 1.0) * rng.normal(1, 0.004)
                unknown = {"contended": None, "contention": "unknown (window 8 ms is shorter than /proc/stat can "
                                                            "resolve: needs 0.40 s)"} if c == "case1" else {}
                store.add({**row, "status": "ok", "step_time_ms_median": ms, "throughput": 32e3 / ms,
                           "peak_mem_allocated_bytes": 2e9, **unknown}, [])
        store.flush()
    for night in range(1, 13):
        write(night)
    result = nightly(root, use_cache=False)
    assert {(s.case_id, s.metric) for s in result.red} == {("case0", "step_time_ms"), ("case0", "throughput")}
    (group,) = result.groups
    # tf32: no series, no effect; case1's unknown contention: judged like the others
    assert (group.series, group.red, group.cases, group.missing, group.contended) == (3, 1, 3, [], [])
    assert "| first night | 3 | 1 | - |" in to_markdown(result)
    assert result.summary == "1 red series"
    assert len(json.loads(to_json(result))["red"]) == 2  # the metrics are still named, one by one
    # a mode the machine ran last night and cannot tonight: missing tonight (no verdict), not silently gone
    write(13, unsupported=("case-tf32", "case2"))
    (group,) = nightly(root, use_cache=False).groups
    assert group.missing == ["case2"] and group.series == 2


def test_bad_input_is_one_line(tree, tmp_path):
    (tree / "baselines.yaml").write_text("- {machine: fp-aaaa, suite: bert}\n")
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 2 and "baselines.yaml: [0].run: missing" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tree / "baselines.yaml").unlink()
    (tree / "annotations.yaml").write_text("- {run: x, window: soon}\n")
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 2 and "annotations.yaml: [0].window: expected a number of days" in proc.stderr


def test_cache_follows_the_csvs(tree):
    from amp_bench.store.cache import load_tree
    first = load_tree(tree)
    assert (tree / ".amp_bench_cache" / "results.pkl").is_file()
    assert load_tree(tree).equals(first)
    write_night(tree, 13, np.random.default_rng(5))
    again = load_tree(tree)
    assert len(again) == len(first) + 2 * 2 * 2 * 3 and again["run_id"].str.startswith("20261213").any()


def test_gate_modules_do_not_import_torch():
    code = ("import sys, amp_bench.analysis.gate.history, amp_bench.analysis.compare, "
            "amp_bench.analysis.gate.nightly, amp_bench.cli.gate, "
            "amp_bench.store.cache, amp_bench.report.dashboard; assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_tonights_interrupted_run_has_no_verdict_and_is_named(tree, tmp_path):
    """A run whose parent was killed (its manifest still says running; its heartbeat names a dead
    process) is no verdict (exit 3), its rows judged as far as they go, and the run named."""
    from amp_bench.store.run_state import identity
    for night in (13, 14):
        write_night(tree, night, np.random.default_rng(night))
    proc = run("nightly", tree, "-o", tmp_path / "green")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the control: green without the kill
    run_dir = tree / "20261214T020000Z-node-a-cuda"
    (run_dir / "manifest.json").write_text(json.dumps({"run_id": run_dir.name, "kind": "benchmark",
                                                       "status": "running", "cases_planned": 12}))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run_dir / "heartbeats").mkdir()
    (run_dir / "heartbeats" / "parent.json").write_text(json.dumps(
        {"name": "parent", **identity(os.getpid()), "pid": dead.pid, "at": "2026-12-14T02:05:00+00:00"}))
    proc = run("nightly", tree, "-o", tmp_path / "n")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "tonight's run did not finish: no verdict" in proc.stdout and "is interrupted" in proc.stdout
    report = json.loads((tmp_path / "n.json").read_text())
    (group,) = [g for g in report["groups"] if g["tonight"] == run_dir.name]
    assert group["unfinished"].startswith("interrupted: its writer (pid") and group["series"] == 2
    assert "Tonight's run did not finish" in (tmp_path / "n.md").read_text()
    assert 'failures="1"' in (tmp_path / "n.junit.xml").read_text()
    assert ">unfinished</failure>" in (tmp_path / "n.junit.xml").read_text()
