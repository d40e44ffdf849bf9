"""Results store and the pairing of each precision with its baseline."""
import datetime as dt
import math
import re

import pandas as pd
import pytest

from amp_bench import load_results
from amp_bench.analysis.speedups import summarize
from amp_bench.errors import UserError
from amp_bench.store.results import RESULT_COLUMNS, RunStore, make_run_id


def test_run_id_is_utc_time_host_device():
    when = dt.datetime(2026, 11, 29, 21, 5, 7, tzinfo=dt.timezone.utc)
    assert make_run_id("nvidia-h200", when, host="node 7.local") == "20261129T210507Z-node-7-local-nvidia-h200"


def test_store_writes_atomically_and_never_collides(tmp_path):
    """A column this version does not declare (a newer writer's part) is kept after the declared ones."""
    import json
    a, b = RunStore(tmp_path, "run"), RunStore(tmp_path, "run")
    assert a.dir != b.dir and b.run_id == "run-2"
    a.write_manifest(status="running")
    (a.dir / "parts" / "00000.json").write_text(json.dumps(
        {"row": {"run_id": "run", "case_id": "x", "status": "ok", "extra_column": 1}, "samples": [{"step": 0}]}))
    a.add({"run_id": "run", "case_id": "y", "status": "oom"}, [], key="00001")
    table = load_results(a.dir)
    assert list(table.columns) == RESULT_COLUMNS + ["extra_column"]
    assert list(table.case_id) == ["x", "y"]
    assert not [p for p in a.dir.iterdir() if "tmp" in p.name]


@pytest.mark.parametrize(("columns", "says"), [
    ({"extra_column": 1}, "extra_column: not a declared results column"),
    ({"batch_size": "8"}, "batch_size: str '8' where int is declared"),
    ({"batch_size": 2.5}, "batch_size: float 2.5 where int is declared"),
    ({"contended": "yes"}, "contended: str 'yes' where bool is declared"),
    ({"throughput": True}, "throughput: bool True where float is declared"),
    ({"status": 0}, "status: int 0 where text is declared"),
])
def test_the_store_writes_no_column_the_declaration_does_not_have_as_it_has_it(tmp_path, columns, says):
    from amp_bench.store.columns import RowError
    store = RunStore(tmp_path, "run")
    with pytest.raises(RowError, match=says):
        store.add({"run_id": "run", "case_id": "x", **columns}, [])
    assert not list((store.dir / "parts").iterdir())
    store.add({"run_id": "run", "case_id": "x", "batch_size": 8.0, "contended": None, "throughput": float("nan"),
               "window_s": 2, "status": "ok"}, [])  # empty cells, a count read back as float, an int as a float


def test_a_row_takes_each_column_from_one_writer_and_keeps_its_warnings_in_order():
    from amp_bench.store.columns import Row, RowError
    row = Row("the launcher", {"world_size": 2, "warnings": "the worker's"})
    with pytest.raises(RowError, match="world_size: written twice, by the launcher and by the worker"):
        row.put("the worker", {"step_time_ms_median": 1.0, "world_size": 2})
    assert "step_time_ms_median" not in row  # nothing of a refused record is put
    row.warn("")
    row.warn("the run loop's")
    assert dict(row) == {"world_size": 2, "warnings": "the worker's | the run loop's"}
    with pytest.raises(RowError, match="warnings: written twice"):
        row.put("the worker", {"warnings": "again"})


def _run_one_faked_case(write_suite, tmp_path, monkeypatch, result: dict | None):
    """One planned case through the run loop, its worker's outcome `result` (None: it died without one)."""
    from amp_bench.launchers import launch
    from amp_bench.launchers.process import WorkerOutcome
    from amp_bench.platform.device import DeviceInfo
    from amp_bench.studies import benchmark
    from amp_bench.studies.session import Machine
    from amp_bench.suite import load_suite
    store = RunStore(tmp_path, "run")
    (case,) = load_suite(write_suite("models: [python:toy_models:mlp]\nbatch_sizes: [4]\nprecisions: [fp32]\n"
                                     "explain: false\n")).cases("cpu")
    monkeypatch.setattr(launch, "run_job", lambda *args, **kwargs: WorkerOutcome(
        result, 0 if result else 1, False, None, 0.1, store.dir / "logs" / "x.log"))
    benchmark.run_cases(store, [(0, case, 0)], Machine(DeviceInfo("cpu", "cpu"), {}, "host", {}), benchmark.Reporter())
    return store


@pytest.mark.parametrize(("result", "patch", "says"), [
    ({"world_size": 2}, None, "world_size: written twice, by the plan and by the worker"),
    ({"log_file": "x.log"}, None, "log_file: written twice, by the launcher and by the worker"),
    ({"hostname": "h"}, None, "hostname: written twice, by the worker and by the machine"),
    ({"steps_run": 8}, None, "steps_run: not a declared results column (store/columns.py), written by the worker"),
    (None, ("amp_bench.launchers.launch._ending", lambda *args: {"status": "error", "exit": 1}),
     "exit: not a declared results column (store/columns.py), written by the launcher"),
    ({}, ("amp_bench.studies.flop_counts.FlopCounts.carry", lambda self, case, row: {"mfu": "high"}),
     "mfu: str 'high' where float is declared, written by the run's FLOPs"),
])
def test_a_column_written_twice_or_not_as_declared_fails_the_run_that_writes_it(write_suite, tmp_path, monkeypatch,
                                                                               result, patch, says):
    """The worker's record, the launcher's and the run loop's columns meet in one row: a column two of them
    write, or one the declarations lack or declare of another kind, stops the run, naming it and its writers."""
    from amp_bench.store.columns import RowError
    if patch:
        monkeypatch.setattr(*patch)
    ok = {"status": "ok", "reason": "", "steps": 3, "samples": []}
    with pytest.raises(RowError, match=re.escape(says)):
        _run_one_faked_case(write_suite, tmp_path / "bad", monkeypatch, result if result is None else {**ok, **result})
    monkeypatch.undo()
    store = _run_one_faked_case(write_suite, tmp_path / "good", monkeypatch, {**ok, "step_time_ms_median": 1.0})
    (row,) = store.rows
    assert row["status"] == "ok" and row["world_size"] == 1 and row["hostname"] == "host" and row["steps"] == 3


def test_a_writer_killed_between_its_part_and_the_tables_loses_no_row(tmp_path):
    """RunStore.add saves the part, then rewrites the tables: a kill between the two (SIGKILL, a lost
    node) leaves a row that only parts/ holds. Readers catch the tables up before they read."""
    import json
    import os

    from amp_bench.store.results import find_runs
    first = RunStore(tmp_path, "run")
    first.write_manifest(status="running")
    (first.dir / "parts" / "00000.json").write_text(json.dumps(
        {"row": {"run_id": "run", "case_id": "x", "status": "ok"}, "samples": [{"step": 0}]}))
    assert not (first.dir / "results.csv").exists()  # killed before its first table
    assert list(load_results(tmp_path).case_id) == ["x"]
    second = RunStore(tmp_path, "later")
    second.write_manifest(status="running")
    second.add({"run_id": "later", "case_id": "x", "status": "ok"}, [])
    (second.dir / "parts" / "00001.json").write_text(json.dumps(
        {"row": {"run_id": "later", "case_id": "y", "status": "ok"}, "samples": []}))
    table = second.dir / "results.csv"
    os.utime(table, ns=(1, 1))  # the table older than the part folder, whatever the clock's grain
    assert list(load_results(second.dir).case_id) == ["x", "y"]
    os.utime(table, ns=(1, 1))
    find_runs(tmp_path)  # status and nightly find runs by manifest: they catch up too
    assert list(pd.read_csv(table).case_id) == ["x", "y"]
    from amp_bench.store.cache import load_cached
    (second.dir / "parts" / "00002.json").write_text(json.dumps(
        {"row": {"run_id": "later", "case_id": "z", "status": "ok", "repeat": 0}, "samples": []}))
    os.utime(table, ns=(1, 1))
    assert sorted(load_cached([tmp_path]).case_id) == ["x", "x", "y", "z"]  # history's cached reader too


def test_a_store_that_rewrites_its_tables_at_most_every_few_seconds_keeps_every_row(tmp_path):
    """flush_every_s (a local run's): the first row reaches the tables at once, later ones with the next
    due rewrite or the run's end; every part is on disk and in `rows` the moment it is added, and a
    reader in between catches the tables up."""
    store = RunStore(tmp_path, "run")
    store.write_manifest(status="running")
    store.flush_every_s = 3600.0
    for n in range(3):
        store.add({"run_id": "run", "case_id": f"c{n}", "status": "ok"}, [{"step": 0}], key=f"{n:05d}")
    assert list(pd.read_csv(store.dir / "results.csv").case_id) == ["c0"] and store.saved == 1
    assert [r["case_id"] for r in store.rows] == ["c0", "c1", "c2"]
    assert len(list((store.dir / "parts").glob("*.json"))) == 3
    assert list(load_results(store.dir).case_id) == ["c0", "c1", "c2"]  # a reader catches up
    store.flush()
    assert list(pd.read_csv(store.dir / "results.csv").case_id) == ["c0", "c1", "c2"] and store.saved == 3


def test_load_results_errors(tmp_path):
    with pytest.raises(UserError, match="no such results directory"):
        load_results(tmp_path / "missing")
    with pytest.raises(UserError, match="no results.csv found"):
        load_results(tmp_path)


def row(precision, ms, mem, status="ok", repeat=0, device="cuda", **extra):
    return {"run_id": "r1", "suite": "s", "model_label": "resnet50", "batch_size": 64, "image_size": 224,
            "seq_len": None, "channels_last": False,
            "device": device, "device_name": "GPU", "precision": precision, "status": status, "repeat": repeat,
            "step_time_ms_median": ms, "throughput": 64 / ms * 1e3 if ms else None, "peak_mem_allocated_bytes": mem,
            "peak_rss_bytes": 10 * mem if mem else None, "rss_before_model_bytes": 0, **extra}


def test_summary_pairs_with_fp32_and_tf32_using_medians_across_repeats():
    frame = pd.DataFrame([
        row("fp32", 100, 1000, repeat=0), row("fp32", 110, 1000, repeat=1), row("fp32", 300, 1000, repeat=2),
        row("tf32", 50, 1000), row("amp_bf16", 40, 600), row("amp_fp16", None, None, status="oom"),
    ])
    table = summarize(frame).set_index("precision")
    assert table.loc["fp32", "step_time_ms"] == 110  # the median resists the 300 ms outlier
    # paired: amp_bf16's only repeat (0) against fp32's repeat 0, not against fp32's median
    assert table.loc["amp_bf16", "speedup_vs_fp32"] == pytest.approx(100 / 40)
    assert table.loc["amp_bf16", "speedup_vs_fp32_pairs"] == 1
    assert table.loc["amp_bf16", "speedup_vs_tf32"] == pytest.approx(50 / 40)
    assert table.loc["amp_bf16", "throughput_speedup_vs_fp32"] == pytest.approx((64 / 40) / (64 / 100))
    assert table.loc["amp_bf16", "mem_saving_vs_fp32"] == pytest.approx(0.4)
    assert table.loc["amp_fp16", "status"] == "oom" and math.isnan(table.loc["amp_fp16", "speedup_vs_fp32"])
    assert table.loc["fp32", "repeats_ok"] == 3 and table.loc["fp32", "status_counts"] == "3 ok"
    assert list(table.index) == ["fp32", "tf32", "amp_fp16", "amp_bf16"]


def test_summary_status_when_some_repeats_fail():
    table = summarize(pd.DataFrame([row("fp32", 100, 1000), row("amp_bf16", 50, 500, repeat=0),
                                    row("amp_bf16", None, None, status="timeout", repeat=1)]))
    amp = table.set_index("precision").loc["amp_bf16"]
    assert amp["status"] == "timeout" and amp["status_counts"] == "1 ok, 1 timeout"
    assert amp["repeats_ok"] == 1 and amp["speedup_vs_fp32"] == pytest.approx(2.0)


def test_summary_without_a_baseline_gives_nan_not_a_guess():
    table = summarize(pd.DataFrame([row("fp32", 100, 1000, status="error"), row("amp_bf16", 50, 500)]))
    amp = table.set_index("precision").loc["amp_bf16"]
    assert math.isnan(amp["speedup_vs_fp32"]) and math.isnan(amp["mem_saving_vs_fp32"])


def test_summary_never_pairs_across_runs():
    frame = pd.DataFrame([row("fp32", 100, 1000), {**row("amp_bf16", 50, 500), "run_id": "r2"}])
    assert summarize(frame).set_index("precision")["speedup_vs_fp32"].isna().loc["amp_bf16"]


def test_summary_uses_rss_on_cpu():
    table = summarize(pd.DataFrame([row("fp32", 100, 1000, device="cpu"), row("amp_bf16", 50, 800, device="cpu")]))
    amp = table.set_index("precision").loc["amp_bf16"]
    assert amp["peak_mem_bytes"] == 8000 and amp["mem_saving_vs_fp32"] == pytest.approx(0.2)


def test_unwritable_results_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(UserError, match="cannot create the results directory"):
        RunStore(blocker, "run")


def test_a_paired_speedup_stays_narrow_when_the_machine_drifts_30_percent_across_repeats():
    """Six repeats on a VM that slows by 30% from the first to the last: each repeat's fp32 and bf16 ran
    back to back, so their ratio barely moves (1.6x +-2%), while the modes' own medians spread 30%. The
    paired interval stays within +-5%; the ratio of the two modes' medians across repeats would not."""
    import numpy as np
    drift = np.linspace(1.0, 1.3, 6)
    wobble = [1.00, 1.02, 0.99, 1.01, 0.98, 1.00]  # the ratio's own repeat-to-repeat noise
    frame = pd.DataFrame([row("fp32", 1000 * d, 1000, repeat=r, device="cpu") for r, d in enumerate(drift)]
                         + [row("amp_bf16", 1000 * d / (1.6 * w), 800, repeat=r, device="cpu")
                            for r, (d, w) in enumerate(zip(drift, wobble, strict=True))])
    amp = summarize(frame).set_index("precision").loc["amp_bf16"]
    assert amp["speedup_vs_fp32"] == pytest.approx(1.6, rel=0.01)
    assert 1.6 * 0.95 < amp["speedup_vs_fp32_ci_low"] < 1.6 < amp["speedup_vs_fp32_ci_high"] < 1.6 * 1.05
    assert amp["speedup_vs_fp32_pairs"] == 6
    # each mode's own step time spread 30% over the run: an unpaired interval could not be this narrow
    fp32 = frame[frame["precision"] == "fp32"]["step_time_ms_median"]
    assert fp32.max() / fp32.min() > 1.29


def test_contended_pairs_are_left_out_of_the_paired_speedup_while_two_clean_ones_remain():
    frame = pd.DataFrame([row("fp32", 100, 1000, repeat=r) for r in range(3)]
                         + [row("amp_bf16", 50, 600, repeat=0), row("amp_bf16", 50, 600, repeat=1),
                            row("amp_bf16", 200, 600, repeat=2, contended=True)])
    amp = summarize(frame).set_index("precision").loc["amp_bf16"]
    assert amp["speedup_vs_fp32"] == pytest.approx(2.0) and amp["speedup_vs_fp32_pairs"] == 2


def test_speedup_spread_pairs_repeats_and_memory_metrics():
    frame = pd.DataFrame([
        row("fp32", 100, 1000, repeat=0, peak_mem_reserved_bytes=2000),
        row("fp32", 120, 1000, repeat=1, peak_mem_reserved_bytes=2000),
        row("amp_fp16", 50, 600, repeat=0, peak_mem_reserved_bytes=1500),
        row("amp_fp16", 40, 600, repeat=1, peak_mem_reserved_bytes=1500),
    ])
    amp = summarize(frame).set_index("precision").loc["amp_fp16"]
    # two pairs: nothing trimmed, the geometric mean of their ratios
    assert amp["speedup_vs_fp32"] == pytest.approx((2.0 * 3.0) ** 0.5)
    assert amp["speedup_vs_fp32_min"] == pytest.approx(2.0) and amp["speedup_vs_fp32_max"] == pytest.approx(3.0)
    assert amp["speedup_vs_fp32_pairs"] == 2 and amp["speedup_vs_fp32_method"].startswith("paired, trimmed t on log "
                                                                                          "ratios")
    assert amp["mem_saving_allocated_vs_fp32"] == pytest.approx(0.4)
    assert amp["mem_saving_reserved_vs_fp32"] == pytest.approx(0.25)
    assert math.isnan(amp["speedup_vs_tf32"]) and math.isnan(amp["speedup_vs_tf32_min"])
