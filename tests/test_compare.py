"""compare: statistics against generated truth, then real CPU runs with a known slowdown."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.intervals import Threshold, bootstrap_median_ratio, judge
from amp_bench.errors import UserError
from conftest import ROOT, amp_bench_cli


def series(rng, median, noise, repeats=2, steps=20):
    return [rng.normal(median, median * noise, steps) for _ in range(repeats)]


@pytest.mark.parametrize("slowdown, noise, verdict", [
    (1.00, 0.01, "no change"), (1.10, 0.01, "regression"), (0.90, 0.01, "improvement"),
    (1.02, 0.01, "no change"),  # a real 2% change is under the 3% threshold
    (1.00, 0.30, "unstable"),
])
def test_verdicts_on_generated_series(slowdown, noise, verdict):
    rng = np.random.default_rng(1)
    ratio, low, high = bootstrap_median_ratio(series(rng, 100, noise), series(rng, 100 * slowdown, noise), rng,
                                              iterations=500)
    assert low <= ratio <= high
    assert judge(low, high, 0.03, worse_when_higher=True) == verdict


def test_no_false_alarms_on_pure_noise():
    rng = np.random.default_rng(7)
    alarms = 0
    for _ in range(100):
        _, low, high = bootstrap_median_ratio(series(rng, 50, 0.02), series(rng, 50, 0.02), rng, iterations=300)
        alarms += judge(low, high, 0.03, worse_when_higher=True) == "regression"
    assert alarms <= 1


def test_the_bootstrap_pools_repeats_of_different_lengths():
    """Each iteration pools its chosen repeats' resampled steps; repeats of different lengths are padded
    inside the computation, and the padding never reaches a median."""
    from amp_bench.analysis.intervals import _resampled_medians
    rng = np.random.default_rng(5)
    # two repeats are never resampled: two draws from (1, 2) and the 100; the median is the larger draw
    assert set(_resampled_medians([np.array([1.0, 2.0]), np.array([100.0])], rng, 400)) == {1.0, 2.0}
    side = [np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0]), np.array([5.0])]

    def one(rng):  # the definition, one iteration at a time
        chosen = rng.integers(0, 3, 3)
        return np.median(np.concatenate([rng.choice(side[j], len(side[j])) for j in chosen]))
    looped = np.array([one(rng) for _ in range(4000)])
    blocks = _resampled_medians(side, rng, 4000, block_values=7)  # many small blocks: their seams too
    assert np.isfinite(blocks).all() and set(blocks) == set(looped)  # the same 13 medians are possible
    assert abs(blocks.mean() - looped.mean()) < 0.3 and abs(np.median(blocks) - np.median(looped)) <= 1.0


def test_thresholds_parse():
    assert Threshold.parse("3%", "time").relative == pytest.approx(0.03)
    assert Threshold.parse("64MiB", "memory", allow_bytes=True).absolute_bytes == 64 * 2**20
    assert Threshold.parse("0B", "memory", allow_bytes=True).absolute_bytes == 0
    with pytest.raises(UserError, match="--threshold-time: expected a percentage"):
        Threshold.parse("64MiB", "time")


SUITE = """
models: [{{ref: "python:toy_models:clocked", label: mlp, options: {{ms: {ms}, seed: {seed}}}}}]
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 2
steps: 20
repeats: 3
explain: false
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real CPU runs of a model that drives a fake clock (step times 20 ms +-2%, whatever the
    machine is doing): a baseline, a rerun of the same, and one deliberately slowed by 30%."""
    import amp_bench
    from conftest import FIXTURES
    root = tmp_path_factory.mktemp("compare")
    (root / "toy_models.py").write_text((FIXTURES / "toy_models.py").read_text())
    dirs = {}
    for seed, (name, ms) in enumerate((("base", 20), ("same", 20), ("slow", 26))):
        suite = root / f"{name}.yaml"
        suite.write_text(SUITE.format(ms=ms, seed=seed))
        dirs[name] = amp_bench.run_suite(suite, device="cpu", results_dir=root / name).attrs["run_dir"]
    return dirs


def run_compare(*args):
    return amp_bench_cli("compare", *args)


@pytest.mark.slow
def test_same_suite_twice_is_no_regression(runs, tmp_path):
    proc = run_compare(runs["base"], runs["same"], "-o", tmp_path / "c")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = json.loads((tmp_path / "c.json").read_text())
    assert verdict["verdict"] == "no regression"
    assert {r["metric"] for r in verdict["results"]} == {"step_time", "throughput", "peak_memory"}


@pytest.mark.slow
def test_a_slowed_candidate_is_a_regression(runs, tmp_path):
    proc = run_compare(runs["base"], runs["slow"], "-o", tmp_path / "c")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    step = next(r for r in result["results"] if r["metric"] == "step_time")
    assert step["verdict"] == "regression" and step["ci_low"] > 1.2 and step["p_value"] < 0.001
    assert next(r for r in result["results"] if r["metric"] == "throughput")["verdict"] == "regression"
    junit = (tmp_path / "c.junit.xml").read_text()
    assert 'failures="2"' in junit and "<failure" in junit
    assert "**regression**" in (tmp_path / "c.md").read_text()
    # and the other way round it is an improvement, not an alarm
    assert run_compare(runs["slow"], runs["base"], "-o", tmp_path / "d").returncode == 0


@pytest.mark.slow
def test_fingerprint_mismatch_is_refused_unless_forced(runs, tmp_path):
    import shutil
    other = tmp_path / "other"
    shutil.copytree(runs["same"], other)
    table = pd.read_csv(other / "results.csv")
    table["fingerprint"] = "0123456789ab"
    table.to_csv(other / "results.csv", index=False)
    proc = run_compare(runs["base"], other, "-o", tmp_path / "c")
    assert proc.returncode == 2 and "machine fingerprints differ" in proc.stderr and "--force" in proc.stderr
    assert "Traceback" not in proc.stderr
    forced = run_compare(runs["base"], other, "-o", tmp_path / "c", "--force")
    assert forced.returncode == 0 and "compared anyway" in forced.stdout


@pytest.mark.slow
def test_not_enough_data(runs, tmp_path):
    import shutil
    empty = tmp_path / "failed"
    shutil.copytree(runs["same"], empty)
    table = pd.read_csv(empty / "results.csv")
    table["status"] = "oom"
    table.to_csv(empty / "results.csv", index=False)
    proc = run_compare(runs["base"], empty, "-o", tmp_path / "c")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no ok result in the candidate (oom)" in proc.stdout


def generated_run(root, name, ms, repeats, steps, cases=("mlp",), rng=None, fingerprint="fp-x", contended=(),
                  slow_contended=1.0, unsupported=None, gaps=None, unknown=(), levels=None):
    """A run directory written from generated step times (no torch); contended: the repeats marked
    contended (the `contended` column), slow_contended: their step times' factor; unsupported: {case:
    reason} written as `unsupported` rows; gaps: per repeat, the window's wall time over the sum of
    its steps (a host-bound case: > 1); unknown: the repeats whose contention is unknown (too short);
    levels: per repeat, a factor on all its steps (processes that run at different speeds)."""
    from amp_bench.stats import Window
    from amp_bench.store.results import RunStore
    rng = rng or np.random.default_rng(0)
    store = RunStore(root, name)
    store.flush_every_s = float("inf")  # the tables once, at the end: rewriting them after every row took seconds
    for case in cases:
        for r in range(repeats):
            busy = {"contended": True, "contention": "another process at 100% CPU"} if r in contended else {}
            if r in unknown:
                busy = {"contended": None, "contention": "unknown (window 8 ms is shorter than /proc/stat can "
                                                         "resolve: needs 0.40 s)"}
            times = rng.normal(ms, ms * 0.01, steps) * (slow_contended if busy.get("contended") else 1.0) \
                * (levels[r] if levels else 1.0)
            window = Window.from_steps(times, 4, seconds=sum(times) / 1e3 * (gaps[r] if gaps else 1.0))
            store.add({"run_id": store.run_id, "case_id": case, "status": "ok", "device": "cpu", "repeat": r,
                       "batch_size": 4, "fingerprint": fingerprint, "peak_rss_bytes": 1e9, **window.to_columns(),
                       **busy},
                      [{"run_id": store.run_id, "case_id": case, "precision": "fp32", "repeat": r, "phase": "measure",
                        "step": i, "step_time_ms": float(t), "loss": 1.0} for i, t in enumerate(times)])
    for case, reason in (unsupported or {}).items():
        for r in range(repeats):
            store.add({"run_id": store.run_id, "case_id": case, "status": "unsupported", "reason": reason,
                       "device": "cpu", "repeat": r, "batch_size": 4, "fingerprint": fingerprint}, [])
    store.flush()
    return store.dir


@pytest.mark.parametrize("repeats, steps", [(1, 3), (1, 20), (2, 20)])
def test_never_passes_for_lack_of_data(tmp_path, repeats, steps):
    from amp_bench.analysis.compare import EXIT_NO_DATA, compare
    base = generated_run(tmp_path, "base", 100, repeats, steps)
    cand = generated_run(tmp_path, "cand", 105, repeats, steps)  # 5% slower
    result = compare([base], [cand])
    assert result.exit_code == EXIT_NO_DATA and result.summary == "not enough data"
    step = next(r for r in result.results if r.metric == "step_time")
    assert step.verdict == "not enough data" and ("repeats" in step.detail or "samples" in step.detail)


def test_processes_that_differ_in_speed_are_no_regression_but_a_consistent_slowdown_is(tmp_path):
    """Repeat medians as two quiet runs of the same suite gave on a VM (each repeat a fresh process,
    up to 15% apart, 100 steps each, 1% step noise): the bootstrap over three repeats alone called a
    16% regression; the repeats' own spread makes it unstable. A 10% slowdown in every process of
    the candidate is still a regression."""
    from amp_bench.analysis.compare import EXIT_REGRESSION, EXIT_UNSTABLE, compare
    base = generated_run(tmp_path, "base", 6.3, 3, 100, levels=[1.0, 1.01, 0.95])
    cand = generated_run(tmp_path, "cand", 6.3, 3, 100, levels=[1.02, 1.17, 1.15])
    step = next(r for r in compare([base], [cand]).results if r.metric == "step_time")
    assert step.ratio > 1.1 and step.verdict == "unstable", step
    # throughput is the step time seen from the other side: by the same rule, it cannot call a
    # regression here (its range across three repeats once did: 0.866, "CI" 0.653-0.958)
    throughput = next(r for r in compare([base], [cand]).results if r.metric == "throughput")
    assert throughput.verdict == "unstable" and throughput.ci_high / throughput.ci_low >= step.ci_high / step.ci_low
    assert "interval widened to the spread between repeats (repeat medians vary by " in step.detail
    assert "% (baseline) and 15% (candidate)" in step.detail
    assert compare([base], [cand]).exit_code == EXIT_UNSTABLE
    slow = generated_run(tmp_path, "slow", 6.3 * 1.10, 3, 100, levels=[1.0, 1.01, 0.99])
    steady = generated_run(tmp_path, "steady", 6.3, 3, 100, levels=[1.0, 1.01, 0.99])
    result = compare([steady], [slow])
    assert next(r for r in result.results if r.metric == "step_time").verdict == "regression"
    assert result.exit_code == EXIT_REGRESSION


def test_one_case_without_data_is_exit_3(tmp_path):
    from amp_bench.analysis.compare import EXIT_NO_DATA, EXIT_OK, compare
    base = generated_run(tmp_path, "base", 100, 3, 20, cases=("a", "b"))
    cand = generated_run(tmp_path, "cand", 100, 3, 20, cases=("a",))
    assert compare([base], [cand]).exit_code == EXIT_NO_DATA
    full = generated_run(tmp_path, "full", 100, 3, 20, cases=("a", "b"))
    assert compare([base], [full]).exit_code == EXIT_OK


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_wholly_contended_side_is_not_comparable(tmp_path, side):
    from amp_bench.analysis.compare import CONTENDED, EXIT_NO_DATA, compare
    busy = {"contended": range(3), "slow_contended": 1.3}
    base = generated_run(tmp_path, "base", 100, 3, 20, **(busy if side == "baseline" else {}))
    cand = generated_run(tmp_path, "cand", 100, 3, 20, **(busy if side == "candidate" else {}))
    result = compare([base], [cand])
    assert result.exit_code == EXIT_NO_DATA and result.summary == CONTENDED
    assert {r.verdict for r in result.results} == {CONTENDED}
    assert all(side in r.detail and "another process" in r.detail for r in result.results)


def test_contended_repeats_are_left_out(tmp_path):
    """Two of five candidate repeats ran 40% slower on a busy machine and say so: they are left out
    (and the notes say so); the same rows without the column count, as before: no pass."""
    from amp_bench.analysis.compare import EXIT_OK, EXIT_REGRESSION, EXIT_UNSTABLE, compare
    base = generated_run(tmp_path, "base", 100, 3, 20, rng=np.random.default_rng(1))
    cand = generated_run(tmp_path, "cand", 100, 5, 20, rng=np.random.default_rng(2), contended=(0, 1),
                         slow_contended=1.4)
    result = compare([base], [cand])
    assert result.exit_code == EXIT_OK, [(r.metric, r.verdict, r.detail) for r in result.results]
    assert any("contended repeats left out" in n and "mlp (0, 2)" in n for n in result.notes)
    table = pd.read_csv(cand / "results.csv").drop(columns=["contended", "contention"])
    table.to_csv(cand / "results.csv", index=False)
    old = compare([base], [cand])
    assert old.exit_code in (EXIT_REGRESSION, EXIT_UNSTABLE) and not any("contended" in n for n in old.notes)


def test_history_noise_floor_widens_the_interval(tmp_path):
    """With the series' night-to-night noise (here 3%), one 5% slower night is no verdict of regression;
    without history, one repeat gives no verdict at all."""
    from amp_bench.analysis.compare import compare
    rng = np.random.default_rng(2)
    tree = tmp_path / "tree"
    for night in range(12):
        generated_run(tree, f"night{night:02d}", 100 * np.exp(rng.normal(0, 0.03)), 1, 20, rng=rng)
    base = generated_run(tmp_path, "base", 100, 1, 20)
    cand = generated_run(tmp_path, "cand", 105, 1, 20)
    with_history = compare([base], [cand], history=tree)
    step = next(r for r in with_history.results if r.metric == "step_time")
    assert step.verdict != "regression" and step.ci_high - step.ci_low > 0.1
    big = compare([base], [generated_run(tmp_path, "big", 140, 1, 20)], history=tree)
    assert next(r for r in big.results if r.metric == "step_time").verdict == "regression" and big.exit_code == 1


def test_compare_prints_its_table_whole_into_a_log_file(tmp_path):
    """stdout to a file (a CI log): every column's header and every case id whole, never cut at 80."""
    cases = ("gpt2-tiny-bs4-seq64-amp_bf16-compiled", "resnet18-bs8-64px-channels_last-amp_fp16")
    base = generated_run(tmp_path, "base", 100, 3, 20, cases=cases)
    cand = generated_run(tmp_path, "cand", 100, 3, 20, cases=cases)
    log = tmp_path / "log.txt"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "amp_bench", "compare", str(base), str(cand), "-o",
                               str(tmp_path / "c")], cwd=ROOT, stdout=fh, stderr=subprocess.PIPE, text=True,
                              timeout=300, env=env)
    text = log.read_text()
    assert proc.returncode == 0, text + proc.stderr
    assert "…" not in text, text
    assert all(case in text for case in cases) and "step_time" in text and "peak_memory" in text
    narrow = subprocess.run([sys.executable, "-m", "amp_bench", "compare", str(base), str(cand), "-o",
                             str(tmp_path / "c2")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**env, "COLUMNS": "60"})
    table = [line for line in narrow.stdout.splitlines() if "│" in line]
    assert table and max(map(len, table)) <= 60 and "…" in narrow.stdout  # COLUMNS wins: a narrow table, cut


NO_TF32 = "tf32 is a CUDA mode (Ampere or newer)"


def test_unsupported_on_both_sides_is_neutral(tmp_path):
    """tf32 and fp16 cannot run on this CPU in either run: not run on either side, listed with the
    reason, and the exit code is the other cases'."""
    from amp_bench.analysis.compare import EXIT_NO_DATA, EXIT_OK, NOT_RUN, compare, to_junit, to_markdown
    lost = {"mlp-tf32": NO_TF32, "mlp-amp_fp16": "CPU has no AVX512-FP16"}
    base = generated_run(tmp_path, "base", 100, 3, 20, unsupported=lost)
    cand = generated_run(tmp_path, "cand", 100, 3, 20, unsupported=lost)
    result = compare([base], [cand])
    assert result.exit_code == EXIT_OK and result.summary == "no regression", \
        [(r.case_id, r.verdict, r.detail) for r in result.results]
    status = {r.case_id: r for r in result.results if r.metric == "status"}
    assert set(status) == set(lost) and {r.verdict for r in status.values()} == {NOT_RUN}
    assert status["mlp-tf32"].detail == NO_TF32
    assert f"{NOT_RUN}: mlp-tf32 ({NO_TF32})" in result.notes
    junit = to_junit(result)
    assert 'failures="0"' in junit
    assert f'name="mlp-tf32.status">\n      <skipped message="{NOT_RUN}: {NO_TF32}"' in junit
    assert f"| mlp-tf32 | status | - | - | - | --- | - | {NOT_RUN} |" in to_markdown(result)
    # the reasons differ between the sides: still neutral, and the detail says so
    other = generated_run(tmp_path, "other", 100, 3, 20, unsupported={**lost, "mlp-tf32": "tf32: not run"})
    differ = next(r for r in compare([base], [other]).results if r.case_id == "mlp-tf32")
    assert differ.verdict == NOT_RUN and "the reasons differ" in differ.detail and NO_TF32 in differ.detail
    # nothing but cases run nowhere: nothing was compared, which is no pass
    empty_base = generated_run(tmp_path, "eb", 100, 3, 20, cases=(), unsupported=lost)
    empty_cand = generated_run(tmp_path, "ec", 100, 3, 20, cases=(), unsupported=lost)
    assert compare([empty_base], [empty_cand]).exit_code == EXIT_NO_DATA


def test_a_mode_lost_in_the_candidate_is_a_finding(tmp_path):
    """The baseline ran mlp-tf32, the candidate's machine cannot: exit 1, its own verdict, a JUnit
    failure. The other way round it is new in the candidate: neutral (exit 0), listed."""
    from amp_bench.analysis.compare import EXIT_OK, EXIT_REGRESSION, LOST, NEW, compare, to_json, to_junit
    base = generated_run(tmp_path, "base", 100, 3, 20, cases=("mlp", "mlp-tf32"))
    cand = generated_run(tmp_path, "cand", 100, 3, 20, unsupported={"mlp-tf32": NO_TF32})
    result = compare([base], [cand])
    assert result.exit_code == EXIT_REGRESSION and result.summary == LOST
    lost = next(r for r in result.results if r.case_id == "mlp-tf32")
    assert (lost.metric, lost.verdict, lost.detail) == ("status", LOST, f"candidate: {NO_TF32}")
    assert 'failures="1"' in to_junit(result)
    assert f"<failure message=\"candidate: {NO_TF32}\">{LOST}" in to_junit(result)
    assert json.loads(to_json(result))["exit_code"] == 1
    back = compare([cand], [base])
    assert back.exit_code == EXIT_OK and back.summary == "no regression"
    new = next(r for r in back.results if r.case_id == "mlp-tf32")
    assert new.verdict == NEW and new.detail == f"baseline: {NO_TF32}"
    assert any(n.startswith(f"{NEW}: mlp-tf32") for n in back.notes)
    assert 'failures="0"' in to_junit(back) and f'<skipped message="{NEW}' in to_junit(back)
    # a regression beside a lost mode: both named
    slow = generated_run(tmp_path, "slow", 130, 3, 20, unsupported={"mlp-tf32": NO_TF32})
    assert compare([base], [slow]).summary == f"regression; {LOST}"


def test_unknown_contention_is_comparable(tmp_path):
    """Rows whose contention is unknown (a window too short for /proc/stat) are neither contended
    nor left out: compared as any row."""
    from amp_bench.analysis.compare import EXIT_OK, compare
    base = generated_run(tmp_path, "base", 100, 3, 20, unknown=(0, 1, 2))
    cand = generated_run(tmp_path, "cand", 100, 3, 20, unknown=(1,))
    result = compare([base], [cand])
    assert result.exit_code == EXIT_OK and not any("contended" in n for n in result.notes)
    assert {r.verdict for r in result.results} == {"no change"}


def test_compare_and_history_agree_on_throughput_of_a_host_bound_case(tmp_path):
    """Same step times, but the candidate's window spends more time between steps (host-bound):
    throughput is the rows' column (host gaps included), so compare's ratio is history's (and
    nightly's) series ratio, and it sees the drop the median step cannot."""
    from amp_bench.analysis.compare import compare
    from amp_bench.analysis.gate.history import run_series
    from amp_bench.store.results import load_results
    base = generated_run(tmp_path, "base", 10, 3, 20, gaps=[1.50, 1.52, 1.48], rng=np.random.default_rng(3))
    cand = generated_run(tmp_path, "cand", 10, 3, 20, gaps=[2.00, 1.96, 2.04], rng=np.random.default_rng(4))
    result = compare([base], [cand])
    by_metric = {r.metric: r for r in result.results}
    step, tput = by_metric["step_time"], by_metric["throughput"]
    series = run_series(load_results([base, cand])).set_index("run_id")["throughput"]
    assert tput.ratio == pytest.approx(series["cand"] / series["base"], rel=1e-12)
    assert tput.baseline == pytest.approx(series["base"], rel=1e-12)
    assert tput.ratio == pytest.approx(1.5 / 2.0, rel=0.03)  # the window's 33% longer gaps...
    assert abs(tput.ratio - 1 / step.ratio) > 0.15  # ...which batch / median step would not show
    assert step.verdict == "no change" and tput.verdict == "regression"
    assert tput.ci_low <= tput.ratio <= tput.ci_high < 0.97


def test_one_junit_writer_escapes_and_counts():
    """compare and nightly share analysis.junit: the file parses back, with every count and message
    intact, whatever characters a case id or a reason holds."""
    import xml.etree.ElementTree as ET

    from amp_bench.analysis.junit import TestCase, to_junit
    text = to_junit("gate", [("host smoke", [TestCase("h.smoke", 'a"b&<c>.step_time', failure="+5.0% vs\nlevel",
                                                      failure_type="regression"),
                                             TestCase("h.smoke", "x.status", skipped="unstable: CI 0.9-1.3"),
                                             TestCase("h.smoke", "y.throughput")]),
                             ("other", [])])
    root = ET.fromstring(text.split("\n", 1)[1])
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("skipped")) == ("testsuites", "3", "1", "1")
    suite = root.find("testsuite")
    assert (suite.get("name"), suite.get("failures"), suite.get("skipped")) == ("host smoke", "1", "1")
    failed = suite.find("testcase/failure")
    assert failed.get("message") == "+5.0% vs\nlevel" and failed.text == "regression"
    assert suite.findall("testcase")[0].get("name") == 'a"b&<c>.step_time'
    assert suite.findall("testcase")[2].find("*") is None  # judged and fine: no child element
    assert root.findall("testsuite")[1].get("tests") == "0"


def test_compare_and_nightly_write_junit_through_the_one_writer():
    import inspect

    from amp_bench.analysis import compare_outputs
    from amp_bench.analysis.gate import nightly
    for module in (compare_outputs, nightly):
        source = inspect.getsource(module)
        assert "junit.to_junit(" in source and "<testcase" not in source, module.__name__


def paired_run(root, name, levels, speedup=1.6, fp32_ms=100.0, noise=0.01, seed=0, stopped=(), bursts=None):
    """A run of one group in fp32 and amp_bf16, each repeat both modes back to back: the repeat's
    `level` (the machine at that moment) moves both alike; `speedup` is what bf16 buys; `stopped`: the
    repeats whose rows a contention monitor stopped early (status contended); `bursts`: repeat -> how
    much slower a steal burst made that repeat's bf16 window alone (the pair straddled it)."""
    from amp_bench.stats import Window
    from amp_bench.store.results import RunStore
    rng = np.random.default_rng(seed)
    store = RunStore(root, name)
    store.flush_every_s = float("inf")  # the tables once, at the end
    for r, level in enumerate(levels):
        for precision, ms in (("fp32", fp32_ms), ("amp_bf16", fp32_ms / speedup)):
            case_id = f"mlp-bs4-{precision}"
            row = {"run_id": store.run_id, "case_id": case_id, "group_id": "mlp-bs4", "model_label": "mlp",
                   "precision": precision, "device": "cpu", "device_name": "cpu", "repeat": r, "batch_size": 4,
                   "fingerprint": "fp-x", "peak_rss_bytes": 1e9}
            if r in stopped:
                store.add({**row, "status": "contended", "contended": True, "reason": "3 other processes used 1.9 "
                           "of 2 cores for 6 s", "contention": "3 other processes used 1.9 of 2 cores for 6 s"}, [])
                continue
            burst = (bursts or {}).get(r, 1.0) if precision == "amp_bf16" else 1.0
            times = rng.normal(ms * level * burst, ms * level * burst * noise, 20)
            window = Window.from_steps(times, 4, seconds=sum(times) / 1e3)
            store.add({**row, "status": "ok", **window.to_columns()},
                      [{"run_id": store.run_id, "case_id": case_id, "precision": precision, "repeat": r,
                        "phase": "measure", "step": i, "step_time_ms": float(t), "loss": 1.0}
                       for i, t in enumerate(times)])
    store.flush()
    return store.dir


def test_a_drifting_machine_leaves_the_step_times_unstable_and_the_paired_speedups_decide(tmp_path):
    """Two same-code runs on a VM that wandered 10% within each run and sat 15% slower during the
    candidate: the step times honestly cannot be compared (the machine's own wander is in their
    interval), but bf16's paired speedup is the same in both: exit 0, and the decision says why."""
    from amp_bench.analysis.compare import EXIT_OK, compare
    base = paired_run(tmp_path, "base", [1.0, 1.1, 0.95, 1.05, 0.9, 1.0])
    cand = paired_run(tmp_path, "cand", [1.15 * x for x in (1.05, 0.95, 1.1, 1.0, 0.92, 1.08)], seed=1)
    result = compare([base], [cand])
    verdicts = {(r.case_id, r.metric): r.verdict for r in result.results}
    assert verdicts[("mlp-bs4-fp32", "step_time")] == "unstable"
    assert verdicts[("mlp-bs4-amp_bf16", "throughput")] == "unstable"
    speedup = next(r for r in result.results if r.metric == "speedup")
    assert speedup.verdict == "no change" and 0.97 < speedup.ci_low < 1 < speedup.ci_high < 1.03, speedup
    assert result.exit_code == EXIT_OK and result.decision.startswith("decided by: the paired speedups")
    assert any(n.startswith("the machine wandered") for n in result.notes)


def test_amp_buying_less_is_a_regression_even_when_the_step_times_cannot_say(tmp_path):
    from amp_bench.analysis.compare import EXIT_REGRESSION, compare
    base = paired_run(tmp_path, "base", [1.0, 1.1, 0.95, 1.05, 0.9, 1.0])
    cand = paired_run(tmp_path, "cand", [1.05, 0.95, 1.1, 1.0, 0.92, 1.08], speedup=1.3, seed=1)
    result = compare([base], [cand])
    speedup = next(r for r in result.results if r.metric == "speedup")
    assert speedup.verdict == "regression" and speedup.ratio == pytest.approx(1.3 / 1.6, rel=0.02)
    assert result.exit_code == EXIT_REGRESSION and "speedup" in result.decision


def test_cases_stopped_early_for_contention_are_not_comparable_and_say_so(tmp_path):
    """The candidate ran beside busy processes and every case was stopped as `contended` with its
    evidence: exit 3, naming contention, never a regression or a pass."""
    from amp_bench.analysis.compare import CONTENDED, EXIT_NO_DATA, compare
    base = paired_run(tmp_path, "base", [1.0] * 4)
    cand = paired_run(tmp_path, "cand", [1.0] * 4, stopped=range(4))
    result = compare([base], [cand])
    assert result.exit_code == EXIT_NO_DATA and result.summary == CONTENDED
    assert all("1.9 of 2 cores" in r.detail for r in result.results if r.verdict == CONTENDED)


def test_the_t_intervals_are_students_with_welchs_degrees_of_freedom():
    """intervals.py takes the t quantile from scipy.special (no scipy.stats import in every command):
    the paired interval and Welch's must be the textbook ones, integer and fractional df alike."""
    from scipy.stats import t

    from amp_bench.analysis.intervals import paired_log_interval, welch_log_interval
    logs = np.log([1.6, 1.7, 1.55, 1.8])
    half = t.ppf(0.975, 3) * logs.std(ddof=1) / np.sqrt(4)
    assert paired_log_interval(logs) == pytest.approx((np.exp(logs.mean()), np.exp(logs.mean() - half),
                                                       np.exp(logs.mean() + half)), rel=1e-12)
    base, cand = np.log([10.0, 11.0, 10.5]), np.log([12.0, 14.0, 12.5, 13.0, 16.0])
    vb, vc = base.var(ddof=1) / 3, cand.var(ddof=1) / 5
    df = (vb + vc) ** 2 / (vb ** 2 / 2 + vc ** 2 / 4)
    assert df != round(df)
    diff, half = cand.mean() - base.mean(), t.ppf(0.975, df) * np.sqrt(vb + vc)
    assert welch_log_interval(base, cand) == pytest.approx((np.exp(diff), np.exp(diff - half), np.exp(diff + half)),
                                                           rel=1e-12)


def test_a_pair_that_straddled_a_steal_burst_does_not_decide_the_speedup_comparison(tmp_path):
    """Same code, twelve pairs a side on a drifting VM, and in each run one pair whose bf16 window alone
    sat in a steal burst (1.8x and 0.6x): the trimmed means leave the two speedups equal within a narrow
    interval (exit 0), where the plain means' Welch interval would have been too wide to decide."""
    from amp_bench.analysis.compare import EXIT_OK, compare
    from amp_bench.analysis.intervals import welch_log_interval
    from amp_bench.analysis.speedups import paired_log_ratios
    levels = [1.0, 1.1, 0.95, 1.05, 0.9, 1.0, 1.2, 0.85, 1.0, 1.1, 0.95, 1.05]
    base = paired_run(tmp_path, "base", levels, noise=0.03, bursts={4: 1.8})
    cand = paired_run(tmp_path, "cand", levels[::-1], noise=0.03, seed=1, bursts={7: 0.6})
    result = compare([base], [cand])
    speedup = next(r for r in result.results if r.metric == "speedup")
    assert speedup.verdict == "no change" and 0.95 < speedup.ci_low < 1 < speedup.ci_high < 1.05, speedup
    assert speedup.baseline == pytest.approx(1.6, rel=0.02) and speedup.candidate == pytest.approx(1.6, rel=0.02)
    assert result.exit_code == EXIT_OK
    from amp_bench.store.results import RESULT_COLUMNS, find_run_dirs, read_table
    logs = [paired_log_ratios(read_table(find_run_dirs([d]), "results", RESULT_COLUMNS), "fp32")
            .query("precision == 'amp_bf16'")["_log"] for d in (base, cand)]
    _, low, high = welch_log_interval(*logs)
    assert high - low > 0.2  # the plain means: "unstable" at the 5% threshold


def test_the_trimmed_intervals_are_yuens():
    """Two runs' speedups compared: Yuen's interval as scipy's ttest_ind(trim=0.2) gives it; one run's:
    the same standard error (the winsorized variance over h(h - 1)/(n - 1)) with h - 1 degrees of
    freedom; below five values nothing is trimmed (the t test above)."""
    from scipy.stats import mstats, t, trim_mean, ttest_ind

    from amp_bench.analysis.intervals import TRIM, paired_log_interval, trimmed_log_interval
    rng = np.random.default_rng(3)
    for n in (6, 10, 16):
        logs = np.log(1.6) + rng.standard_t(3, n) * 0.1
        point, low, high = paired_log_interval(logs)
        assert point == pytest.approx(np.exp(trim_mean(logs, TRIM)), rel=1e-12)
        kept = n - 2 * int(TRIM * n)
        winsorized = np.asarray(mstats.winsorize(logs, limits=(TRIM, TRIM)))
        half = t.ppf(0.975, kept - 1) * np.sqrt((n - 1) * winsorized.var(ddof=1) / (kept * (kept - 1)))
        assert (low, high) == pytest.approx((point * np.exp(-half), point * np.exp(half)), rel=1e-9)
    base, cand = rng.normal(0.4, 0.1, 16), rng.normal(0.45, 0.2, 11)
    expected = ttest_ind(cand, base, equal_var=False, trim=TRIM).confidence_interval()
    ratio, low, high = trimmed_log_interval(base, cand)
    assert ratio == pytest.approx(np.exp(trim_mean(cand, TRIM) - trim_mean(base, TRIM)), rel=1e-12)
    assert (low, high) == pytest.approx((np.exp(expected.low), np.exp(expected.high)), rel=1e-9)


@pytest.mark.parametrize("low, high, verdict", [(0.842, 1.018, "no change"), (0.922, 1.128, "unstable"),
                                                (0.97, 1.03, "no change"), (0.80, 1.25, "unstable")])
def test_an_intervals_width_is_judged_the_same_whichever_way_the_ratio_is_taken(low, high, verdict):
    """An interval and its reciprocal are equally wide on the log scale, so both get one verdict (a
    linear width called 0.842-1.018 narrow enough and its reciprocal 0.982-1.188 too wide)."""
    from amp_bench.analysis.intervals import judge
    assert judge(low, high, 0.05, worse_when_higher=True) == verdict
    assert judge(1 / high, 1 / low, 0.05, worse_when_higher=True) == verdict
    assert judge(low, high, 0.05, worse_when_higher=False) == verdict  # a speedup's, as compare prints it
