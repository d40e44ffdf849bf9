"""One case identity and one label (amp_bench/store/identity.py): a new axis of the matrix is one entry
in CASE_AXES, and every reader that groups or names cases sees it."""
import pandas as pd

from amp_bench.analysis.explain.categories import CATEGORIES
from amp_bench.store import identity


def _rows():
    """One model on one GPU in fp32 and amp_bf16, twice: once with SGD, once with AdamW (`optimizer`,
    a column every row has, but not an axis of the matrix until a test makes it one)."""
    rows = []
    for optimizer, slower in (("sgd", 1.0), ("adamw", 1.2)):
        for precision, ms in (("fp32", 100.0), ("amp_bf16", 50.0)):
            for repeat in range(3):
                rows.append({
                    "run_id": "r1", "suite": "s", "case_id": f"m-{optimizer}-{precision}", "model_label": "m",
                    "batch_size": 8, "image_size": 224, "seq_len": None, "channels_last": False, "world_size": 1,
                    "compile_mode": "eager", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3",
                    "architecture": "Hopper", "precision": precision, "status": "ok", "repeat": repeat,
                    "optimizer": optimizer, "step_time_ms_median": ms * slower * (1 + 0.01 * repeat),
                    "throughput": 8 / (ms * slower) * 1e3, "peak_mem_allocated_bytes": 1e9,
                    "explain_status": "ok", "explain_busy_ms": ms, "explain_host_ms": 1.0,
                    **{f"explain_{c}_ms": (ms / len(CATEGORIES)) for c in CATEGORIES}})
    return pd.DataFrame(rows)


def test_a_new_axis_in_one_place_separates_cases_in_every_reader(monkeypatch):
    from amp_bench.analysis.explain.decompose import explain_results
    from amp_bench.analysis.gpus import compare_gpus
    from amp_bench.analysis.headline import headlines
    from amp_bench.analysis.speedups import summarize
    from amp_bench.report.charts import _x_label
    rows = _rows()
    merged = summarize(rows)
    assert len(merged) == 2 and len(headlines(merged)) == 1  # without the axis: one case, its runs pooled
    monkeypatch.setitem(identity.CASE_AXES, "optimizer", None)
    summary = summarize(rows)
    assert len(summary) == 4 and set(summary["optimizer"]) == {"sgd", "adamw"}
    sentences = headlines(summary)
    assert len(sentences) == 2 and any("optimizer adamw" in s for s in sentences), sentences
    assert len({label for label, _ in explain_results(rows)}) == 2
    assert compare_gpus(summary, rows)["case"].nunique() == 2
    assert _x_label(summary).nunique() == 2


def test_one_label_reads_every_axis():
    row = {"model_label": "resnet50", "batch_size": 256, "image_size": 224, "seq_len": float("nan"),
           "channels_last": "True", "world_size": 2.0, "compile_mode": "max-autotune"}
    assert identity.case_label(row) == "resnet50 bs 256 224px channels_last 2 processes compiled (max-autotune)"
    assert identity.case_label({**row, "compile_mode": "default", "world_size": 1}, model=False) == \
        "bs 256 224px channels_last compiled"
    gpt = {"model_label": "gpt2", "batch_size": 8, "image_size": None, "seq_len": 128, "channels_last": None,
           "world_size": None, "compile_mode": None}
    assert identity.case_label(gpt) == "gpt2 bs 8 seq 128"


def test_every_axis_of_a_suite_case_is_an_axis_of_the_rows(write_suite):
    """The suite's Case builds group_id from its axes: two cases with different group ids differ in a
    column CASE_AXES names, so readers keep them apart as the ids do."""
    from amp_bench.launchers.launch import base_row
    from amp_bench.platform.device import DeviceInfo
    from amp_bench.suite import load_suite
    suite = load_suite(write_suite("""
models: [torchvision/resnet18, {ref: torchvision/resnet18, label: r18b}]
batch_sizes: [8, 16]
image_size: [64, 112]
channels_last: [false, true]
compile: [false, true]
nproc_per_node: [1, 2]
precisions: [fp32]
"""))
    cpu = DeviceInfo("cpu", "cpu")
    rows = {case.group_id: base_row(case, 0, cpu, {}, "r") for case in suite.cases("cpu")}
    assert len(rows) == 2 * 2 * 2 * 2 * 2 * 2
    keys = {tuple(str(row[a]) for a in identity.case_axes()) for row in rows.values()}
    assert len(keys) == len(rows)  # no two groups share their axes' values
