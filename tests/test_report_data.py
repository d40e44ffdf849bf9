"""The report's plotting-free layer: pairing, ratios, failed and missing baselines, merged machines."""
import math

import numpy as np
import pandas as pd
import pytest
from fake_results import write_machine_runs

from amp_bench.errors import UserError
from amp_bench.report.data import claims_table, collect, environment_table, not_measured, verdict
from amp_bench.store.results import find_run_dirs


@pytest.fixture
def two_machines(tmp_path):
    return write_machine_runs(tmp_path / "results")


def test_two_machines_merge_but_never_pair_across_machines(two_machines, tmp_path):
    data = collect([tmp_path / "results"])
    assert len(data.run_dirs) == 2
    summary = data.summary
    assert set(summary["machine"]) == {"NVIDIA A100-SXM4-80GB (Ampere) @ node-a", "NVIDIA H200 (Hopper) @ node-b"}
    h200 = summary[(summary.machine.str.contains("H200")) & (summary.batch_size == 128)].set_index("precision")
    a100 = summary[(summary.machine.str.contains("A100")) & (summary.batch_size == 128)].set_index("precision")
    # each machine's AMP is compared with its own fp32: the ratios differ as the machines do
    assert h200.loc["amp_fp16", "speedup_vs_fp32"] == pytest.approx(3079 / 800, rel=0.1)
    assert a100.loc["amp_fp16", "speedup_vs_fp32"] == pytest.approx(2470 / 410, rel=0.1)
    assert h200.loc["amp_fp16", "speedup_vs_tf32"] == pytest.approx(3079 / 2259, rel=0.1)
    assert h200.loc["amp_fp16", "mem_saving_allocated_vs_fp32"] == pytest.approx(0.38, abs=0.03)
    assert h200.loc["amp_fp16", "speedup_vs_fp32_pairs"] == 2
    assert h200.loc["amp_fp16", "speedup_vs_fp32_min"] <= h200.loc["amp_fp16", "speedup_vs_fp32"] \
        <= h200.loc["amp_fp16", "speedup_vs_fp32_max"]


def test_failed_baseline_leaves_ratios_empty_and_the_failure_listed(two_machines, tmp_path):
    data = collect([tmp_path / "results"])
    summary = data.summary
    a100_256 = summary[(summary.machine.str.contains("A100")) & (summary.batch_size == 256)].set_index("precision")
    assert a100_256.loc["fp32", "status"] == "oom"
    assert math.isnan(a100_256.loc["amp_bf16", "speedup_vs_fp32"])
    assert a100_256.loc["amp_bf16", "speedup_vs_tf32"] > 1  # the tf32 baseline still stands
    missing = not_measured(data.results)
    assert list(missing.status) == ["oom"] and list(missing.repeats) == ["0, 1"]
    assert missing.case_id.iloc[0] == "resnet50-bs256-224px-fp32" and "CUDA out of memory" in missing.reason.iloc[0]
    claims = claims_table(summary)
    row = claims[(claims.machine.str.contains("A100")) & (claims.batch_size == 256) &
                 (claims.precision == "amp_bf16") & (claims.baseline == "fp32")].iloc[0]
    assert row.speedup_verdict == "fp32 baseline oom" and math.isnan(row.speedup)


def test_claims_state_the_baseline_and_give_a_verdict(two_machines, tmp_path):
    claims = claims_table(collect([tmp_path / "results"]).summary)
    h200 = claims[(claims.machine.str.contains("H200")) & (claims.batch_size == 128) & (claims.precision == "amp_fp16")]
    by_base = h200.set_index("baseline")
    assert by_base.loc["fp32", "speedup_verdict"] == "above"  # ~3.8x vs strict fp32
    assert by_base.loc["tf32", "speedup_verdict"] == "below"  # ~1.36x vs tf32
    assert by_base.loc["fp32", "memory_verdict"] == "below"  # ~38% saved
    assert by_base.loc["tf32", "memory_verdict"].startswith("n/a")
    assert verdict(1.5, (1.5, 3.0)) == "within" and verdict(float("nan"), (1.5, 3.0)) == "not measured"


def test_environment_differences_are_flagged(two_machines, tmp_path):
    env = environment_table(collect([tmp_path / "results"]))
    assert {"torch_version", "driver_version", "device_name"} <= set(env.attrs["differs"])
    assert "cuda_version" not in env.attrs["differs"]
    assert set(env.python_version) == {"3.11.7"}


def test_inputs_resolve_dirs_trees_and_globs(two_machines, tmp_path):
    assert len(find_run_dirs([two_machines[0]])) == 1
    assert len(find_run_dirs([tmp_path / "results"])) == 2
    assert len(find_run_dirs([str(tmp_path / "results" / "*node-b*")])) == 1
    with pytest.raises(UserError, match="no path matches"):
        find_run_dirs([str(tmp_path / "nothing*")])
    with pytest.raises(UserError, match="no results.csv found"):
        find_run_dirs([two_machines[0] / "logs"])


def test_merging_a_machine_without_any_ratio_draws_every_row(two_machines, tmp_path):
    """A CPU run (no tf32) merged with GPU runs: the tf32 chart has an empty row for it, and the
    crosses for missing baselines land in their own machine's row."""
    import json

    from amp_bench.report import build_report
    from amp_bench.store.results import RunStore
    cpu = RunStore(tmp_path / "results", "20261129T010000Z-node-c-cpu")
    cpu.write_manifest(run_id=cpu.run_id)
    for precision, status in (("fp32", "ok"), ("tf32", "unsupported"), ("amp_bf16", "ok")):
        cpu.add({"run_id": cpu.run_id, "suite": "resnet50", "case_id": f"resnet50-bs8-224px-{precision}",
                 "model_label": "resnet50", "batch_size": 8, "image_size": 224, "precision": precision,
                 "channels_last": False, "device": "cpu", "device_name": "AMD EPYC", "architecture": "CPU",
                 "hostname": "node-c", "repeat": 0, "status": status, "reason": "",
                 "step_time_ms_median": 1500.0 if precision == "fp32" else (870.0 if status == "ok" else None),
                 "throughput": 5.3, "peak_rss_bytes": 2e9, "rss_before_model_bytes": 5e8, "num_threads": 2}, [])
    written = build_report([tmp_path / "results"], tmp_path / "r.html")
    html = written["html"].read_text()
    assert "chart-speedup-tf32" in html and "node-c" in html
    claims = json.loads(pd.read_csv(written["csv_claims"]).to_json(orient="records"))
    cpu_claim = next(c for c in claims if "node-c" in c["machine"] and c["precision"] == "amp_bf16")
    assert cpu_claim["memory_metric"] == "peak RSS above pre-model RSS"
    assert cpu_claim["memory_saving"] == pytest.approx(0.0)  # same RSS both sides in this fake


def test_markdown_says_which_cases_paid_gradscalers_host_sync(two_machines, tmp_path):
    from amp_bench.report.render import render_markdown
    data = collect([tmp_path / "results"])
    assert "GradScaler host sync" not in render_markdown(data, data.summary, claims_table(data.summary),
                                                         not_measured(data.results))
    synced = (data.results["precision"] == "amp_fp16")
    data.results["scaler_host_sync"] = synced  # as a non-fused optimizer records it
    text = render_markdown(data, data.summary, claims_table(data.summary), not_measured(data.results))
    line = next(t for t in text.splitlines() if t.startswith("GradScaler host sync: "))
    assert "amp_fp16" in line and "amp_bf16" not in line and "fused optimizer avoids it" in line


def test_not_measured_cross_sits_in_its_own_slot_of_the_bar_group():
    """An unsupported mode's cross is drawn in that mode's own slot (its offset group), at parity,
    never on the neighbouring mode's bar and never as a zero bar."""
    from amp_bench.report.charts import NOT_MEASURED_HEIGHT, speedup_chart
    rows = []
    for precision, speedup, status in (("fp32", 1.0, "ok"), ("amp_fp16", np.nan, "unsupported"),
                                       ("amp_bf16", 1.7, "ok")):
        rows.append(dict(precision=precision, speedup_vs_fp32=speedup, speedup_vs_fp32_min=speedup,
                         speedup_vs_fp32_max=speedup, speedup_vs_fp32_pairs=3, status=status, reason="no fp16 here",
                         batch_size=8, channels_last=False, model_label="m", machine="h", step_time_ms=1.0,
                         status_counts="3 ok", image_size=224, seq_len=np.nan, world_size=1, compile_mode="eager",
                         contended_vs_fp32=False, emulated=False))
    figure = speedup_chart(pd.DataFrame(rows))
    cross = next(t for t in figure.data if t.name == "not measured")
    bars = {t.name: t for t in figure.data if t.name != "not measured"}
    assert cross.type == "bar" and cross.offsetgroup == "amp_fp16" != bars["amp_bf16"].offsetgroup
    assert cross.alignmentgroup == bars["amp_bf16"].alignmentgroup  # the same group of slots
    assert cross.base[0] + cross.y[0] / 2 == pytest.approx(1.0) and cross.y[0] == NOT_MEASURED_HEIGHT
    assert "amp_fp16: unsupported" in cross.text[0]
