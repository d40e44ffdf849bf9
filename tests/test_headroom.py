"""Batch-size headroom: the search itself (against a known limit), a real search under a CPU memory
cap checked by rerunning the batch it reports and the next one, and OOM probes that kill the worker."""
import dataclasses
import os
import subprocess
import sys

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from amp_bench.analysis.headroom import ratios_vs_fp32
from amp_bench.studies.headroom_search import run_headroom, search_max_batch
from conftest import ROOT


def _limit_probe(limit, calls=None):
    def probe(batch):
        if calls is not None:
            calls.append(batch)
        return ("ok", "") if batch <= limit else ("oom", "out of memory")
    return probe


@settings(max_examples=300, deadline=None)
@given(limit=st.integers(0, 5000), start=st.integers(1, 64), cap=st.integers(1, 6000), resolution=st.integers(1, 16))
def test_search_brackets_the_true_limit(limit, start, cap, resolution):
    calls = []
    found = search_max_batch(_limit_probe(limit, calls), start, max(start, cap), resolution)
    cap = max(start, cap)
    if limit < start:
        assert found.status == "nothing fits" and found.largest_fit is None and calls == [start]
        return
    assert found.status == "ok"
    assert found.largest_fit <= limit  # never reports a batch that does not fit
    if limit >= cap:
        assert found.largest_fit == cap and found.limit_reached and found.smallest_oom is None
    else:
        assert found.smallest_oom > limit and found.smallest_oom - found.largest_fit <= resolution
        assert not found.limit_reached
        if resolution == 1:
            assert found.largest_fit == limit
    assert len(calls) == len(set(calls))  # no batch probed twice
    assert len(calls) <= 2 * (cap.bit_length() + 1)


def test_a_probe_that_fails_otherwise_stops_the_search_with_its_status():
    def probe(batch):
        return ("ok", "") if batch < 8 else ("timeout", "no result within timeout_s=5")
    found = search_max_batch(probe, 2, 1024)
    assert found.status == "timeout" and "batch 8" in found.reason
    assert found.largest_fit == 4 and found.probes == [(2, "ok"), (4, "ok"), (8, "timeout")]


def test_nonfinite_loss_is_not_a_memory_verdict():
    found = search_max_batch(lambda b: ("nonfinite", "") if b <= 10 else ("oom", ""), 1, 100)
    assert found.status == "ok" and found.largest_fit == 10


def test_unguarded_arguments_cannot_hang_or_overshoot():
    found = search_max_batch(_limit_probe(10), 4, 64, resolution=0)
    assert found.largest_fit == 10 and found.smallest_oom == 11
    found = search_max_batch(_limit_probe(1000), 100, 50)
    assert found.largest_fit == 50 and found.limit_reached


def _row(precision, batch, throughput, world_size=1, nproc=None, limit=False):
    return {"run_id": "r", "model_label": "m", "image_size": 32, "seq_len": None, "channels_last": False,
            "world_size": world_size, "nproc_per_node": nproc, "precision": precision, "status": "ok",
            "max_batch_size": batch, "throughput_at_max": throughput, "limit_reached": limit}


def test_ratios_pair_within_a_world_size_and_mark_bounds():
    out = ratios_vs_fp32(pd.DataFrame([_row("fp32", 100, 10.0, 1, 1), _row("amp_bf16", 200, 18.0, 1, 1),
                                       _row("fp32", 50, 16.0, 2, 2), _row("amp_bf16", 90, 30.0, 2, 2)]))
    assert out["batch_ratio_vs_fp32"].tolist() == [1.0, 2.0, 1.0, 1.8]
    assert out["throughput_ratio_vs_fp32"].tolist() == pytest.approx([1.0, 1.8, 1.0, 1.875])
    bounded = ratios_vs_fp32(pd.DataFrame([_row("fp32", 100, 10.0), _row("amp_bf16", 1024, 18.0, limit=True)]))
    assert bounded["batch_ratio_vs_fp32"].iloc[1] == pytest.approx(10.24)
    assert bool(bounded["batch_ratio_is_lower_bound"].iloc[1])
    unknown = ratios_vs_fp32(pd.DataFrame([_row("fp32", 1024, 10.0, limit="True"), _row("amp_bf16", 1024, 18.0,
                                                                                       limit=True)]))
    assert pd.isna(unknown["batch_ratio_vs_fp32"].iloc[1])  # fp32's own maximum was never found


def test_ratios_against_fp32_per_model():
    table = pd.DataFrame([
        {"run_id": "r", "model_label": "m", "image_size": None, "seq_len": None, "channels_last": False,
         "precision": "fp32", "status": "ok", "max_batch_size": 60, "throughput_at_max": 100.0},
        {"run_id": "r", "model_label": "m", "image_size": None, "seq_len": None, "channels_last": False,
         "precision": "amp_bf16", "status": "ok", "max_batch_size": 150, "throughput_at_max": 180.0},
        {"run_id": "r", "model_label": "n", "image_size": None, "seq_len": None, "channels_last": False,
         "precision": "amp_bf16", "status": "ok", "max_batch_size": 150, "throughput_at_max": 180.0},
    ])
    out = ratios_vs_fp32(table)
    assert out["batch_ratio_vs_fp32"].tolist()[:2] == [1.0, 2.5]
    assert out["throughput_ratio_vs_fp32"].tolist()[1] == pytest.approx(1.8)
    assert pd.isna(out["batch_ratio_vs_fp32"].iloc[2])  # no fp32 search for model n


CAPPED = """
models: [{ref: "python:toy_models:fat_activations", options: {k: 262144}}]
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 1
timeout_s: 60
explain: false
headroom: {memory_cap_gb: 0.5, max_batch_size: 1024, resolution: 1, measure: false}
"""  # 16 MB a tensor per sample: the limit is ~10 samples, and each probe touches half a GB, not two


@pytest.mark.slow
def test_search_under_a_cpu_memory_cap_is_within_one_step_of_the_limit(write_suite, tmp_path):
    from amp_bench.launchers.launch import run_one
    from amp_bench.platform.device import DeviceInfo, precision_support
    from amp_bench.studies.session import probe, server_for
    from amp_bench.suite import load_suite

    suite_path = write_suite(CAPPED)
    table = run_headroom(suite_path, device="cpu", results_dir=tmp_path / "results")
    row = table.iloc[0]
    assert row["status"] == "ok", row["reason"]
    largest, first_oom = int(row["max_batch_size"]), int(row["first_oom_batch_size"])
    assert first_oom == largest + 1
    assert 2 < largest < 64  # the cap, not the search range, set the limit
    run_dir = tmp_path / "results" / table.attrs["run_dir"].split("/")[-1]
    probes = pd.read_csv(run_dir / "headroom_probes.csv")
    assert (probes["status"] == "oom").any() and set(probes["status"]) <= {"ok", "oom"}
    assert len(probes) == row["probes"]
    assert set(probes["worker_start"]) == {"fork"}  # each probe a child of the run's fork server

    # check independently: the reported batch trains under the cap, the next one runs out
    probed = probe("cpu")
    device = DeviceInfo.from_json(probed["device"])
    case = load_suite(suite_path).cases("cpu")[0]
    case = dataclasses.replace(case, memory_cap_bytes=2**29, instrument=False)
    from amp_bench.store.results import RunStore
    store = RunStore(tmp_path / "check", "check")
    support = precision_support(case.precision, device)
    # each a fresh child of a fork server, as the search's probes were (a spawned interpreter imports torch again)
    with server_for("fork", [case.model.ref], (str(suite_path.parent),)) as server:
        fits, _ = run_one(dataclasses.replace(case, batch_size=largest), 0, device, probed["versions"], store, support,
                          server=server)
        over, _ = run_one(dataclasses.replace(case, batch_size=largest + 1), 0, device, probed["versions"], store,
                          support, server=server)
    assert fits["status"] == "ok", fits.get("reason")
    assert over["status"] == "oom", (largest, probes[["batch_size", "status"]].values.tolist(), over.get("reason"))
    assert fits["memory_cap_kind"] == "address space above the bare torch process"


KILLED = """
models:
  - {ref: "python:toy_models:killed_above", options: {limit: 20}}
batch_sizes: [4]
precisions: [fp32]
warmup_steps: 1
steps: 2
timeout_s: 60
explain: false
headroom: {max_batch_size: 64, resolution: 4}
"""


@pytest.mark.slow
def test_probes_killed_like_the_oom_killer_do_not_end_the_run(write_suite, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "headroom", str(write_suite(KILLED)), "--device", "cpu",
                           "--results-dir", str(tmp_path / "results"), "--reports-dir", str(tmp_path / "reports")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    run_dir = next((tmp_path / "results").iterdir())
    row = pd.read_csv(run_dir / "headroom.csv").iloc[0]
    assert row["status"] == "ok"
    assert row["max_batch_size"] <= 20 < row["first_oom_batch_size"] <= row["max_batch_size"] + 4
    probes = pd.read_csv(run_dir / "headroom_probes.csv")
    killed = probes[probes["batch_size"] > 20]
    assert not killed.empty and (killed["status"] == "oom").all()
    assert killed["reason"].str.contains("SIGKILL").all()
    results = pd.read_csv(run_dir / "results.csv")  # the measurement at the largest batch
    assert results["batch_size"].tolist() == [row["max_batch_size"]] and results["status"].tolist() == ["ok"]
    assert "largest batch that trains" in proc.stdout
    try:
        import plotly  # noqa: F401
    except ImportError:  # the GPU image has no plotly: the run says so and keeps its results
        assert "report skipped: plotly is not installed" in proc.stdout
    else:
        assert any(p.suffix == ".html" for p in (tmp_path / "reports").iterdir())


def test_failed_rows_name_model_precision_and_why():
    from amp_bench.analysis.headroom import failed_rows
    base = {"model_label": "resnet18", "max_batch_size": 512, "reason": "", "measure_status": None}
    table = pd.DataFrame([
        {**base, "precision": "fp32", "status": "ok", "measure_status": "ok"},
        {**base, "precision": "tf32", "status": "unsupported", "reason": "the CPU has no TF32"},
        {**base, "precision": "amp_fp16", "status": "timeout", "reason": "batch 1024: worker ran past 120 s"},
        {**base, "precision": "amp_bf16", "status": "ok", "measure_status": "error"},
        {**base, "model_label": "vit", "precision": "fp32", "status": "nothing fits", "max_batch_size": None,
         "reason": "batch 32 already runs out of memory"},
    ])
    assert failed_rows(table) == [
        "resnet18 amp_fp16: timeout (batch 1024: worker ran past 120 s)",
        "resnet18 amp_bf16: the measurement at its largest batch (512) ended error",
        "vit fp32: nothing fits (batch 32 already runs out of memory)"]
    assert "resnet18 tf32: unsupported (the CPU has no TF32)" in failed_rows(table, allow_unsupported=False)
    assert failed_rows(table.iloc[:2]) == []
