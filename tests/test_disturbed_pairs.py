"""A blip must not cost the headline: a pair another process disturbed is left out of the paired speedup and
its medians, run again at the end while the run's allowance holds it, and the headline says how many pairs its
figure rests on; only too few clean pairs take the figure away. The same rule in compare and the GPUs table."""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.compare import compare
from amp_bench.analysis.gpus import compare_gpus
from amp_bench.analysis.headline import headlines
from amp_bench.analysis.speedups import summarize
from amp_bench.store.results import RunStore
from amp_bench.studies.retry import RETRY_SHARE, Allowance, pairs_to_retry

RATIO = 1.80  # bf16 over fp32, as on the 2-core EPYC


def _rows(contended=(), stopped=(), repeats=6, run="20261204T000000Z-vm-cpu", seed=0):
    """fp32 and amp_bf16 rows of a 6-repeat CPU run: a repeat in `contended` ran flagged as contended (3x
    slower, so a figure that kept it would show it), one in `stopped` was stopped (no figures)."""
    rng = np.random.default_rng(seed)
    rows = []
    for repeat in range(repeats):
        level = rng.uniform(0.95, 1.05)  # the VM's speed this repeat: both sides alike
        for precision, ms in (("fp32", 1450.0), ("amp_bf16", 1450.0 / RATIO)):
            row = {"run_id": run, "suite": "resnet50", "case_id": f"resnet50-bs8-224px-{precision}",
                   "group_id": "resnet50-bs8-224px", "model_label": "resnet50", "batch_size": 8, "image_size": 224,
                   "precision": precision, "device": "cpu", "device_name": "AMD EPYC", "repeat": repeat,
                   "status": "ok", "reason": "", "contended": False, "peak_rss_bytes": 1.6e9 if precision == "fp32"
                   else 1.2e9}
            if repeat in stopped:
                row.update(status="contended", contended=True, reason="1 other process (bash) used 0.62 of 2 cores",
                           contention="1 other process (bash) used 0.62 of 2 cores for 3.2 s")
            else:
                median = ms * level * rng.uniform(0.99, 1.01) * (3.0 if repeat in contended else 1.0)
                row.update(step_time_ms_median=median, step_time_ms_ci_low=median * 0.98,
                           step_time_ms_ci_high=median * 1.02, throughput=8 / median * 1e3)
                if repeat in contended:
                    row.update(contended=True, contention="1 other process (bash) used 0.62 of 2 cores")
            rows.append(row)
    return pd.DataFrame(rows)


def _bf16(summary):
    return summary[summary["precision"] == "amp_bf16"].iloc[0]


@pytest.mark.parametrize("how", ["stopped", "flagged"])
def test_one_disturbed_pair_of_six_is_dropped_and_the_headline_keeps_its_figure(how):
    rows = _rows(stopped=(2,)) if how == "stopped" else _rows(contended=(2,))
    summary = summarize(rows)
    bf16 = _bf16(summary)
    assert bf16["status"] == "ok" and not bf16["contended_vs_fp32"]
    assert bf16["speedup_vs_fp32_pairs"] == 5 and bf16["speedup_vs_fp32_dropped"] == 1
    assert bf16["speedup_vs_fp32"] == pytest.approx(RATIO, rel=0.03)
    fp32 = summary[summary["precision"] == "fp32"].iloc[0]
    assert fp32["step_time_ms"] == pytest.approx(1450, rel=0.06)  # the 3x-slow repeat is not in the median
    (sentence,) = headlines(summary)
    assert "bf16 autocast is 1.8" in sentence and "; 5 of 6 pairs, 1 dropped: contended)" in sentence
    assert "CONTENDED" not in sentence


def test_too_few_clean_pairs_take_the_figure_away_and_say_how_many():
    summary = summarize(_rows(contended=(0, 1, 2, 3), stopped=(4,)))
    bf16 = _bf16(summary)
    assert bf16["contended_vs_fp32"]
    (sentence,) = headlines(summary)
    assert "bf16 autocast contended: 1 clean pair(s) of 6, too few for an interval" in sentence
    assert "faster than fp32" not in sentence


def test_a_clean_run_says_nothing_about_pairs():
    (sentence,) = headlines(summarize(_rows()))
    assert "dropped" not in sentence and "pairs" not in sentence and "(95% CI " in sentence


def _write_run(root: Path, rows: pd.DataFrame) -> Path:
    store = RunStore(root, rows["run_id"].iloc[0])
    store.write_manifest(run_id=store.run_id, status="complete", versions={}, device={"name": "AMD EPYC"})
    for row in rows.to_dict("records"):
        store.add({k: v for k, v in row.items() if v == v}, [])
    store.flush()
    return store.dir


def test_compare_applies_the_same_rule(tmp_path):
    base = _write_run(tmp_path / "a", _rows(run="20261204T000000Z-vm-cpu", seed=1))
    dropped = _write_run(tmp_path / "b", _rows(run="20261204T010000Z-vm-cpu", seed=2, stopped=(3,)))
    starved = _write_run(tmp_path / "c", _rows(run="20261204T020000Z-vm-cpu", seed=3, contended=(0, 1, 2, 3, 4)))
    kept = compare([str(base)], [str(dropped)])
    assert not any(r.verdict == "not comparable (contended)" for r in kept.results)
    gone = compare([str(base)], [str(starved)])
    verdicts = {r.verdict for r in gone.results if r.metric == "step_time"}
    assert verdicts == {"not comparable (contended)"}
    assert any("too few repeats clean of contention" in (r.detail or "") for r in gone.results)


def test_the_gpus_table_says_how_many_pairs_its_speedup_left_out():
    rows = _rows(stopped=(2,))
    table = compare_gpus(summarize(rows), rows)
    bf16 = table[table["precision"] == "amp_bf16"].iloc[0]
    assert bf16["speedup_pairs_dropped"] == 1 and bf16["speedup_vs_reference_mode"] == pytest.approx(RATIO, rel=0.03)


def _item(index, precision, repeat, group="g"):
    return (index, SimpleNamespace(group_id=group, case_id=f"{group}-{precision}", precision=precision), repeat)


def test_a_disturbed_row_brings_its_whole_repeat_back_and_a_flag_only_where_the_case_stops():
    measured = [(_item(0, "fp32", 0), {"status": "ok"}), (_item(1, "amp_bf16", 0), {"status": "ok"}),
                (_item(2, "fp32", 1), {"status": "ok", "contended": True}),
                (_item(3, "amp_bf16", 1), {"status": "ok"}),
                (_item(4, "fp32", 2), {"status": "contended"}), (_item(5, "amp_bf16", 2), {"status": "ok"})]
    stop = pairs_to_retry(measured, lambda case: True)
    assert [[i for i, _, _ in pair] for pair in stop] == [[2, 3], [4, 5]]
    flag = pairs_to_retry(measured, lambda case: False)  # on_contention: flag keeps a flagged row
    assert [[i for i, _, _ in pair] for pair in flag] == [[4, 5]]


def test_the_retry_allowance_is_the_budget_left_or_a_share_of_the_run():
    budgeted = Allowance(elapsed_s=100.0, budget_left_s=-45.0)  # a main job: its windows' budget spent
    assert budgeted.left_s == RETRY_SHARE * 100.0
    assert budgeted.take(12.0) and budgeted.take(12.0) and not budgeted.take(12.0)
    assert Allowance(100.0, 60.0).left_s == 60.0
    assert Allowance(100.0, None, budgeted=False).take(1e6)  # no budget: every disturbed pair again


@pytest.mark.slow
def test_a_disturbed_lockstep_pair_is_run_again_in_lockstep_and_replaces_its_rows(write_suite, tmp_path,
                                                                                  monkeypatch):
    """The parent's contention watch stops the first lockstep set it watches (as a neighbour's burst would);
    at the end the machine is quiet: that repeat's two modes run again as a lockstep set, their rows
    replace the stopped ones and say why, and every pair is clean."""
    from test_busy import _StarvedOnce

    import amp_bench
    from amp_bench.launchers import busy, launch
    monkeypatch.setenv("AMP_BENCH_ON_CONTENTION", "stop")
    monkeypatch.setattr(_StarvedOnce, "watched", 0)
    monkeypatch.setattr(launch, "ContentionWatch", _StarvedOnce)
    monkeypatch.setattr(busy, "quiet_now", lambda needed, **kw: (True, "other processes used 0.05 of 2 cores"))
    suite = write_suite("models: [{ref: 'python:toy_models:sleepy', label: slow, options: {ms: 150}}]\n"
                        "batch_sizes: [4]\nprecisions: [fp32, amp_bf16]\nallow_emulated: true\nwarmup_steps: 1\n"
                        "steps: 3\nrepeats: 3\nexplain: false\ntimeout_s: 60\n")
    results = amp_bench.run_suite(suite, device="cpu", results_dir=tmp_path / "results")
    assert len(results) == 6 and set(results["status"]) == {"ok"}  # the stopped rows were replaced
    # (a busy test machine may flag other pairs at their windows' edges: those run again too)
    stopped = results[results["rerun_reason"].fillna("").str.startswith("contended: 3 other processes (python3 x3)")]
    assert len(stopped) == 2 and stopped["repeat"].nunique() == 1  # one pair, both its modes
    assert set(stopped["interleave"]) == {"steps"}  # run again as it first ran: a lockstep set
    assert stopped["warnings"].str.contains("its pair's first run was disturbed").all()
    manifest = json.loads((Path(results.attrs["run_dir"]) / "manifest.json").read_text())
    assert "contended_not_retried" not in manifest
