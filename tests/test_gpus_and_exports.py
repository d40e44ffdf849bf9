"""GPUs compared in the report (recorded-shape rows of a V100, an A100, an L4 and an H100), and the
exports to Bencher (BMF JSON) and Apache Otava (CSV + otava.yaml)."""
import json

import pandas as pd
import pytest
import yaml
from fake_results import FLEET, write_gpu_fleet, write_machine_runs

from amp_bench.analysis import exports
from amp_bench.analysis.gpus import compare_gpus, load_prices, pivot_cells, price_for, reference_view
from amp_bench.cli import main
from amp_bench.errors import UserError
from amp_bench.report import build_report
from amp_bench.report.data import collect


@pytest.fixture
def fleet(tmp_path):
    write_gpu_fleet(tmp_path / "results")
    return tmp_path / "results"


def test_gpus_are_rows_modes_columns_and_a_missing_mode_is_never_zero(fleet):
    data = collect([fleet], {"H100": 2.5, "A100-SXM4": 1.2, "v100": 0.4})
    table = compare_gpus(data.summary, data.results, data.prices)
    assert list(dict.fromkeys(table["architecture"])) == ["Volta", "Ampere", "Ada", "Hopper"]  # generation order
    by = table.set_index(["gpu", "precision"])
    v100, a100 = "Tesla V100-SXM2-16GB (Volta) [v100]", "NVIDIA A100-SXM4-80GB (Ampere) [a100]"
    l4, h100 = "NVIDIA L4 (Ada) [l4]", "NVIDIA H100 80GB HBM3 (Hopper) [h100]"
    for gpu, mode in ((v100, "amp_bf16"), (v100, "tf32"), (v100, "fp8"), (a100, "fp8")):
        assert by.loc[(gpu, mode), "status"] == "unsupported" and pd.isna(by.loc[(gpu, mode), "throughput"])
    for gpu in (l4, h100):  # fp8 only from Ada on
        assert by.loc[(gpu, "fp8"), "status"] == "ok" and by.loc[(gpu, "fp8"), "throughput"] > 0
    # each GPU's own speedup over fp32, from its own run
    rates = FLEET["h100"][5]
    assert by.loc[(h100, "amp_bf16"), "speedup_vs_reference_mode"] == pytest.approx(
        rates["amp_bf16"] / rates["fp32"], rel=0.05)
    # samples/s per watt = samples per joule; MFU against that GPU's peak; samples per $ from the prices
    row = by.loc[(a100, "amp_bf16")]
    assert row["samples_per_watt"] == pytest.approx(row["throughput"] / (400 * 0.9), rel=0.03)
    assert 0 < row["mfu"] < 1
    assert row["samples_per_dollar"] == pytest.approx(row["throughput"] * 3600 / 1.2)
    assert pd.isna(by.loc[(l4, "fp32"), "samples_per_dollar"])  # no price for the L4: none invented
    cells = pivot_cells(table)["resnet50 bs 256 224px channels_last"].set_index("GPU")
    assert cells.loc[v100, "amp_bf16"].startswith("not supported here: bf16 needs compute capability >= 8.0")
    assert "samples/s" in cells.loc[h100, "fp8"] and "vs fp32" in cells.loc[h100, "fp8"] and "MFU" in cells.loc[h100,
                                                                                                                "fp8"]
    assert "0.0 samples/s" not in " ".join(cells.to_numpy().ravel())


def test_the_reference_view_divides_by_one_gpu_mode_by_mode(fleet):
    data = collect([fleet])
    view = reference_view(compare_gpus(data.summary, data.results), "A100").set_index(["gpu", "precision"])
    h100 = "NVIDIA H100 80GB HBM3 (Hopper) [h100]"
    assert view.loc[(h100, "amp_bf16"), "vs_reference"] == pytest.approx(2750 / 2400, rel=0.05)
    assert view.loc[(h100, "fp8"), "note"] == "not supported on the reference"
    assert view.loc[("Tesla V100-SXM2-16GB (Volta) [v100]", "amp_bf16"), "note"] == "not supported here"
    with pytest.raises(UserError, match=r"--reference 'T4': no such GPU in these results \(they have: Tesla V100"):
        reference_view(compare_gpus(data.summary, data.results), "T4")
    with pytest.raises(UserError, match="matches 3 GPUs"):
        reference_view(compare_gpus(data.summary, data.results), "NVIDIA")


def test_price_files_are_matched_by_name_and_bad_ones_refused_in_one_line(tmp_path):
    prices = {"H100": 2.0, "NVIDIA H100 80GB HBM3": 3.0, "a100-spot": 0.9}
    assert price_for("NVIDIA H100 80GB HBM3", "", prices) == 3.0  # the exact name first
    assert price_for("NVIDIA H100 PCIe", "", prices) == 2.0
    assert price_for("NVIDIA A100-SXM4-80GB", "a100-spot", prices) == 0.9  # a partition's own price
    assert price_for("Tesla T4", "", prices) is None
    good = tmp_path / "prices.yaml"
    good.write_text("H100: 2.49\nL4: 0.8\n")
    assert load_prices(good) == {"H100": 2.49, "L4": 0.8}
    for text, words in (("H100: free\n", "H100: expected a price per GPU-hour above 0, got 'free'"),
                        ("- 1\n", "expected a mapping of GPU name to price"), ("a: [\n", "unreadable price file")):
        good.write_text(text)
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_prices(good)
    with pytest.raises(UserError, match="price file not found"):
        load_prices(tmp_path / "none.yaml")


def test_the_report_has_the_section_with_prices_and_a_reference(fleet, tmp_path, capsys):
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 2.5\nA100: 1.2\n")
    written = build_report([fleet], tmp_path / "r.html", prices=prices, reference="V100")
    page = written["html"].read_text()
    assert "GPUs compared" in page and "chart-machines" in page and "samples per $" in page
    assert "Against Tesla V100-SXM2-16GB (Volta) [v100]" in page and "No price for: NVIDIA L4 (Ada) [l4]" in page
    md = written["md"].read_text()
    assert "## GPUs compared" in md and "not supported here: fp8 needs compute capability" in md
    gpus = pd.read_csv(written["csv_gpus"])
    assert set(gpus["gpu"].str.extract(r"\[(\w+)\]")[0]) == {"v100", "a100", "l4", "h100"}
    assert main(["report", str(fleet), "-o", str(tmp_path / "x.html"), "--reference", "B200"]) == 2
    assert "--reference 'B200': no such GPU" in capsys.readouterr().err
    one = tmp_path / "one"
    write_gpu_fleet(one)
    for other in list(one.iterdir())[1:]:
        __import__("shutil").rmtree(other)
    page = build_report([one], tmp_path / "one.html")["html"].read_text()
    assert "Only one GPU (or CPU) in these results" in page


# --------------------------------------------------------------------------- exports

def _bmf_shape_errors(report) -> list[str]:
    """Bencher Metric Format: {benchmark: {measure: {value, lower_value?, upper_value?}}}, numbers, lower <=
    value <= upper (bencher.dev's JSON adapter)."""
    errors = []
    if not isinstance(report, dict) or not report:
        return ["not a non-empty object"]
    for bench, measures in report.items():
        if not isinstance(bench, str) or not isinstance(measures, dict) or not measures:
            errors.append(f"{bench}: expected an object of measures")
            continue
        for name, metric in measures.items():
            if not isinstance(metric, dict) or set(metric) - {"value", "lower_value",
                                                              "upper_value"} or "value" not in metric:
                errors.append(f"{bench}.{name}: expected value[, lower_value, upper_value]")
                continue
            if not all(isinstance(v, (int, float)) and v == v for v in metric.values()):
                errors.append(f"{bench}.{name}: not numbers")
            elif not metric.get("lower_value", metric["value"]) <= metric["value"] <= metric.get("upper_value",
                                                                                                 metric["value"]):
                errors.append(f"{bench}.{name}: value outside its bounds")
    return errors


def test_the_shape_check_can_fail():
    assert _bmf_shape_errors({"b": {"m": {"value": 2, "lower_value": 3}}}) == ["b.m: value outside its bounds"]
    assert _bmf_shape_errors({"b": {"m": {"mean": 2}}}) == ["b.m: expected value[, lower_value, upper_value]"]


def test_bmf_is_one_machines_medians_with_their_intervals(tmp_path, capsys):
    write_machine_runs(tmp_path / "results")
    with pytest.raises(UserError, match="holds 2 machines .*pass --machine NAME"):
        exports.to_bmf(tmp_path / "results")
    report = exports.to_bmf(tmp_path / "results", machine="node-b")
    assert _bmf_shape_errors(report) == []
    case = report["resnet50/resnet50-bs256-224px-amp_bf16"]
    assert set(case) == {"step-time-ms", "throughput-samples-per-s", "peak-memory-bytes"} <= set(exports.MEASURES)
    rows = pd.read_csv(next((tmp_path / "results").glob("*node-b*")) / "results.csv")
    medians = rows[rows["case_id"] == "resnet50-bs256-224px-amp_bf16"]["step_time_ms_median"]
    assert case["step-time-ms"]["value"] == pytest.approx(medians.median())
    assert main(["export", str(tmp_path / "results"), "--format", "bmf", "--machine", "node-b"]) == 0
    assert json.loads(capsys.readouterr().out) == report
    assert main(["export", str(tmp_path / "nowhere"), "--format", "bmf"]) == 2
    assert "no such results directory" in capsys.readouterr().err


def test_otava_reads_one_series_per_file_with_its_config(tmp_path):
    for night in range(3):  # three nights of one machine: a series Otava can analyse
        write_gpu_fleet(tmp_path / f"n{night}")
        for d in (tmp_path / f"n{night}").iterdir():
            if "h100" not in d.name:
                continue
            target = tmp_path / "results" / d.name.replace("20261201T02", f"2026120{night + 1}T02")
            target.parent.mkdir(exist_ok=True)
            d.rename(target)
            for name in ("results.csv", "samples.csv"):
                text = (target / name).read_text().replace(d.name, target.name)
                (target / name).write_text(text)
    written = exports.write_otava(tmp_path / "results", tmp_path / "otava")
    config = yaml.safe_load(written[0].read_text())["tests"]
    assert len(config) == 5  # one series per mode the H100 ran (fp32, tf32, amp_fp16, amp_bf16, fp8)
    name, test = next((k, v) for k, v in config.items() if k.endswith("amp-bf16"))
    assert test["type"] == "csv" and test["time_column"] == "time"
    table = pd.read_csv(test["file"])
    assert list(table.columns) == ["time", *test["attributes"], *test["metrics"]]
    assert {"machine", "suite", "case", "run"} <= set(test["attributes"])
    assert {"step_time_ms", "throughput", "peak_memory_bytes", "energy_j_per_sample"} == set(test["metrics"])
    assert len(table) == 3 and table["time"].tolist() == sorted(table["time"])
    assert table["time"].iloc[0] == "2026-12-01 02:00:00 +0000" and set(table["machine"]) == {"h100-node01 [h100]"}
