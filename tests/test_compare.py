"""compare: statistics against generated truth, then real CPU runs with a known slowdown."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.compare import Threshold, bootstrap_median_ratio, judge
from amp_bench.errors import UserError
from conftest import ROOT


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
    return subprocess.run([sys.executable, "-m", "amp_bench", "compare", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


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
                  slow_contended=1.0):
    """A run directory written from generated step times (no torch); contended: the repeats marked
    contended (issue 12's column), slow_contended: their step times' factor."""
    from amp_bench.store.results import RunStore
    rng = rng or np.random.default_rng(0)
    store = RunStore(root, name)
    for case in cases:
        for r in range(repeats):
            busy = {"contended": True, "contention": "another process at 100% CPU"} if r in contended else {}
            times = rng.normal(ms, ms * 0.01, steps) * (slow_contended if busy else 1.0)
            store.add({"run_id": store.run_id, "case_id": case, "status": "ok", "device": "cpu", "repeat": r,
                       "batch_size": 4, "fingerprint": fingerprint, "step_time_ms_median": float(np.median(times)),
                       "throughput": 4e3 / float(np.median(times)), "peak_rss_bytes": 1e9, **busy},
                      [{"run_id": store.run_id, "case_id": case, "precision": "fp32", "repeat": r, "phase": "measure",
                        "step": i, "step_time_ms": float(t), "loss": 1.0} for i, t in enumerate(times)])
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
