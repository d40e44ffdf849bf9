"""One case identity and one label (amp_bench/identity.py): a new axis of the matrix is one entry
in CASE_AXES, and every reader that groups or names cases sees it."""
import pandas as pd

from amp_bench import identity
from amp_bench.analysis.explain.categories import CATEGORIES


def _rows(compiled: bool = False):
    """One model on one GPU in fp32 and amp_bf16, twice: once with SGD, once with AdamW (`optimizer`,
    a column every row has, but not an axis of the matrix until a test makes it one); eager, and with
    `compiled` also under torch.compile. Each row's case_id is the one identity gives it."""
    rows = []
    for optimizer, slower in (("sgd", 1.0), ("adamw", 1.2)):
        for compile_mode, faster in (("eager", 1.0), ("default", 0.8))[: 2 if compiled else 1]:
            for precision, ms in (("fp32", 100.0 * slower * faster), ("amp_bf16", 50.0 * slower * faster)):
                for repeat in range(3):
                    row = {
                        "run_id": "r1", "suite": "s", "model_label": "m", "batch_size": 8, "image_size": 224,
                        "seq_len": None, "channels_last": False, "world_size": 1, "compile_mode": compile_mode,
                        "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "architecture": "Hopper",
                        "hostname": "h", "fingerprint": "f", "timestamp": "2026-12-01T00:00:00+00:00",
                        "precision": precision, "status": "ok", "repeat": repeat, "optimizer": optimizer,
                        "step_time_ms_median": ms * (1 + 0.01 * repeat), "throughput": 8 / ms * 1e3,
                        "peak_mem_allocated_bytes": 1e9, "explain_status": "ok", "explain_busy_ms": ms,
                        "explain_host_ms": 1.0, **{f"explain_{c}_ms": (ms / len(CATEGORIES)) for c in CATEGORIES}}
                    rows.append({**row, "case_id": identity.case_id(row, precision),
                                 "group_id": identity.group_id(row)})
    return pd.DataFrame(rows)


def test_a_new_axis_in_one_place_separates_cases_in_every_reader(monkeypatch, tmp_path):
    """`optimizer` becomes an axis in CASE_AXES alone: every reader that groups or names cases keeps the
    SGD and AdamW cases apart (summary, headline, explain, GPUs compared, charts, the compile section, the
    nightly series and the exports), where without the axis the first six pool them."""
    from amp_bench.analysis.explain.decompose import explain_results
    from amp_bench.analysis.exports import otava_tables, to_bmf
    from amp_bench.analysis.gate.history import run_series, series_keys
    from amp_bench.analysis.gpus import compare_gpus
    from amp_bench.analysis.headline import headlines
    from amp_bench.analysis.speedups import summarize
    from amp_bench.report.charts import _x_label
    from amp_bench.report.compile_section import compile_table, speedup_matrix
    merged = summarize(_rows(compiled=True))
    assert len(merged) == 4 and len(headlines(merged[merged["compile_mode"] == "eager"])) == 1  # one case, pooled
    assert len(speedup_matrix(merged)) == 2  # one case, two precisions
    monkeypatch.setitem(identity.CASE_AXES, "optimizer", None)
    rows, compiled = _rows(), _rows(compiled=True)
    summary = summarize(rows)
    assert len(summary) == 4 and set(summary["optimizer"]) == {"sgd", "adamw"}
    sentences = headlines(summary)
    assert len(sentences) == 2 and any("optimizer adamw" in s for s in sentences), sentences
    assert len({label for label, _ in explain_results(rows)}) == 2
    assert compare_gpus(summary, rows)["case"].nunique() == 2
    assert _x_label(summary).nunique() == 2
    assert len(compile_table(summarize(compiled))) == 8 and len(speedup_matrix(summarize(compiled))) == 4
    assert run_series(rows).groupby(series_keys()).ngroups == 4  # two cases in two precisions
    (tmp_path / "r1").mkdir()
    rows.to_csv(tmp_path / "r1" / "results.csv", index=False)
    assert len(to_bmf(tmp_path)) == 4 and len(otava_tables(tmp_path)) == 4
    assert rows["case_id"].nunique() == 4 and "optimizer-adamw" in rows["case_id"].iloc[-1]  # the id says it too


def test_the_compile_section_keeps_cases_that_differ_only_in_image_size_apart():
    """Two cases alike but for the image size were one row of the compile matrix, their speedups
    pooled into one median: each is its own row now, named by its label."""
    from amp_bench.analysis.speedups import summarize
    from amp_bench.report.compile_section import compile_table, speedup_matrix
    rows = _rows(compiled=True)
    rows = rows[rows["optimizer"] == "sgd"]
    small = rows.assign(image_size=160, step_time_ms_median=rows["step_time_ms_median"] / 2)
    both = pd.concat([rows, small], ignore_index=True)
    both["case_id"] = [identity.case_id(r, r["precision"]) for _, r in both.iterrows()]
    matrix = speedup_matrix(summarize(both))
    assert len(matrix) == 4 and {case for case, _ in matrix.index} == {"m bs 8 224px", "m bs 8 160px"}
    assert compile_table(summarize(both))["case"].nunique() == 2


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


def test_a_variant_is_an_axis_of_its_own(write_suite):
    """A case that tries an advice item (`variant`, set by run --try) keeps the suite case's axes: its id,
    group, label and row say the variant, and a case without one is named as before."""
    import dataclasses

    from amp_bench.launchers.launch import base_row
    from amp_bench.platform.device import DeviceInfo
    from amp_bench.suite import load_suite
    (case,) = load_suite(write_suite("models: [torchvision/resnet18]\nbatch_sizes: [8]\nprecisions: [fp32]\n")
                         ).cases("cpu")
    tried = dataclasses.replace(case, variant="optimizer_impl=fused")
    assert case.variant == "" and case.case_id == "resnet18-bs8-224px-fp32"
    assert tried.case_id == "resnet18-bs8-224px-try-optimizer_impl-fused-fp32" and tried.group_id != case.group_id
    row = base_row(tried, 0, DeviceInfo("cpu", "cpu"), {}, "r")
    assert row["variant"] == "optimizer_impl=fused" and identity.case_label(row).endswith("try optimizer_impl=fused")
    assert identity.case_label(base_row(case, 0, DeviceInfo("cpu", "cpu"), {}, "r")) == "resnet18 bs 8 224px"
