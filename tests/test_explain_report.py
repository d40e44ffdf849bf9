"""The report's "Where the time goes" section: markdown, the per-category CSV, the how-to-turn-it-on
note without breakdowns, and the charts drawn in headless Chromium (offline) as the other sections."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.explain.categories import CATEGORIES
from amp_bench.report import build_report
from amp_bench.store.results import RunStore

# the shape of this project's own CPU check (ResNet-18, batch 8, 2-core EPYC), rounded; only feeds the report
TIMES = {"fp32": {"gemm": 103, "conv": 3323, "elementwise": 725, "norm": 1417, "reduction": 218, "cast": 0.1,
                  "layout": 58, "optimizer": 143, "other": 0.0, "host": 23, "median": 6100},
         "amp_bf16": {"gemm": 12, "conv": 1496, "elementwise": 230, "norm": 571, "reduction": 138, "cast": 214,
                      "layout": 62, "optimizer": 150, "other": 0.0, "host": 40, "median": 2900}}


def write_explained_run(root: Path, with_explain: bool = True) -> Path:
    store = RunStore(root, "20261201T000000Z-host-cpu")
    store.write_manifest(run_id=store.run_id, status="complete", versions={"python_version": "3.11.7"},
                         device={"name": "cpu", "cpu_model": "AMD EPYC"})
    rng = np.random.default_rng(0)
    for precision, t in TIMES.items():
        case_id = f"resnet18-bs8-224px-{precision}"
        row = {"run_id": store.run_id, "suite": "resnet18", "case_id": case_id, "group_id": "resnet18-bs8-224px",
               "model": "torchvision/resnet18", "model_label": "resnet18", "batch_size": 8, "precision": precision,
               "cpu_bf16_isa": "avx512_bf16",
               "channels_last": False, "image_size": 224, "device": "cpu", "device_name": "cpu", "repeat": 0,
               "hostname": "host", "warmup_steps": 2, "steps": 5, "status": "ok", "reason": "",
               "step_time_ms_median": t["median"], "throughput": 8 / (t["median"] / 1e3)}
        if with_explain:
            row.update({f"explain_{c}_ms": float(t.get(c, 0.0)) for c in CATEGORIES})
            row.update(explain_host_ms=float(t["host"]),
                       explain_status="ok", explain_reason="", explain_misaligned_flop_share=0.065,
                       explain_misaligned_layers="conv1 Conv2d(3 -> 64, 7x7) 6.5%",
                       explain_trace=f"traces/{case_id}.json.gz")
        times = rng.normal(t["median"], t["median"] * 0.02, 5)
        store.add(row, [{"run_id": store.run_id, "case_id": case_id, "precision": precision, "repeat": 0,
                         "phase": "measure", "step": i, "step_time_ms": float(v), "loss": 2.3}
                        for i, v in enumerate(times)])
    return store.dir


def test_markdown_and_csv_carry_the_breakdown(tmp_path):
    write_explained_run(tmp_path / "results")
    written = build_report([tmp_path / "results"], tmp_path / "report.html")
    md = written["md"].read_text()
    assert "## Where the time goes" in md
    assert "resnet18 bs 8 224px: amp_bf16 made GEMM+conv 2.3x faster, but they are 57% of the fp32 step" in md
    assert "casts added 4%" in md and "2.1x measured" in md and "conv1 Conv2d(3 -> 64, 7x7) 6.5%" in md
    table = pd.read_csv(written["csv_explain"])
    assert set(table["precision"]) == {"fp32", "amp_bf16"} and "host" in set(table["category"])
    fp32 = table[table["precision"] == "fp32"].set_index("category")["ms_per_step"]
    assert fp32["conv"] == 3323 and fp32.sum() == pytest.approx(sum(v for k, v in TIMES["fp32"].items()
                                                                    if k != "median"))


def test_without_breakdowns_the_report_says_how_to_turn_it_on(tmp_path):
    write_explained_run(tmp_path / "results", with_explain=False)
    written = build_report([tmp_path / "results"], tmp_path / "report.html")
    page = written["html"].read_text()
    assert "Where the time goes" in page and "explain: true" in page and "python -m amp_bench explain" in page
    assert "## Where the time goes" not in written["md"].read_text()


@pytest.mark.slow
def test_the_section_draws_in_chromium_offline(tmp_path):
    import test_report_browser as browser  # skips where Chromium is missing, as that file does
    write_explained_run(tmp_path / "results")
    dom, charts = browser.report_charts(tmp_path)
    assert {"explain", "explain-waterfall"} <= set(charts)
    browser.assert_every_chart_drew(dom, ["explain", "explain-waterfall"])
    assert "Where the time goes" in dom
    assert "2.1x measured, of a 1.9x ceiling; above it, but within the measurement" in dom


def test_alignment_rows_keep_machines_and_compile_modes_apart_and_say_shares_in_percent():
    from amp_bench.report.explain_section import _alignment_display, alignment_rows
    base = {"model_label": "mlp", "batch_size": 8, "precision": "amp_bf16", "explain_status": "ok", "device": "cuda",
            "explain_misaligned_flop_share": 0.125, "explain_misaligned_layers": "head Linear(64 -> 100) 12.5%"}
    rows = pd.DataFrame([{**base, "device_name": "A100", "compile_mode": "eager"},
                         {**base, "device_name": "H100", "compile_mode": "eager"},
                         {**base, "device_name": "H100", "compile_mode": "default"},
                         {**base, "device_name": "H100", "compile_mode": "eager", "channels_last": True}])
    cases = list(alignment_rows(rows)["case"])  # a case differing only in its layout keeps a row of its own
    assert cases == ["mlp bs 8 on A100", "mlp bs 8 on H100", "mlp bs 8 compiled on H100",
                     "mlp bs 8 channels_last on H100"]
    shown = _alignment_display(alignment_rows(rows))
    assert list(shown["share of the step's FLOPs"]) == ["12.5%"] * 4


def test_every_layer_with_its_alignment_is_in_the_layers_csv(tmp_path):
    """The report's .explain_layers.csv lists every GEMM/conv layer of each profiled step (the section
    shows only the misaligned ones): a 100-wide linear is misaligned, a 256-wide one is not."""
    run_dir = write_explained_run(tmp_path / "results")
    records = [{"name": "body", "kind": "Linear", "dims": {"in": 256, "out": 256, "rows": 8}},
               {"name": "head", "kind": "Linear", "dims": {"in": 256, "out": 100, "rows": 8}}]
    (run_dir / "traces").mkdir(exist_ok=True)
    for precision in TIMES:
        (run_dir / "traces" / f"resnet18-bs8-224px-{precision}.layers.json").write_text(json.dumps(records))
    written = build_report([tmp_path / "results"], tmp_path / "report.html")
    layers = pd.read_csv(written["csv_explain_layers"])
    assert set(layers["precision"]) == set(TIMES) and len(layers) == 2 * len(TIMES)
    by_module = layers.drop_duplicates("module").set_index("module")
    assert not by_module.loc["head", "aligned"] and by_module.loc["head", "misaligned_8"] == "out_features=100"
    assert by_module.loc["body", "aligned"] and by_module.loc["body", "flop_share"] > by_module.loc["head",
                                                                                                    "flop_share"]
