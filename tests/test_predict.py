"""`predict`: the scaling rules on hand-made kernels, the TF32 meaning per architecture,
unsupported targets, op costing from recorded shapes, and the command on a stored CPU run and a
stored GPU trace (tests/data/predict/, sources in its README)."""
import shutil
from pathlib import Path

import pandas as pd
import pytest

from amp_bench.analysis.predict import ops
from amp_bench.analysis.predict.model import INTERVALS, predict_mode, predict_run
from amp_bench.analysis.predict.scaling import FLOOR_MS, KERNEL_MIN_MS, Work, math_unit, roofline_ms, scale
from amp_bench.analysis.predict.source import CaseSource, ModeSource
from amp_bench.cli import main
from amp_bench.platform.gpu_specs import SPECS, achievable, by_key, find
from amp_bench.studies.gpu_predictions import predict_source

DATA = Path(__file__).resolve().parent / "data" / "predict"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """rich cuts tables at COLUMNS (80 under xdist): give the printed tables room to be read whole."""
    monkeypatch.setenv("COLUMNS", "1000")
SPEC = by_key()
IEEE, TF32 = (False, False), (True, True)


def _bw(key: str) -> float:
    return SPEC[key].bandwidth_gbs * achievable(SPEC[key], "bandwidth")[0]


def _rate(key: str, unit: str) -> float:
    return SPEC[key].peak(unit) * achievable(SPEC[key], unit)[0]


# --------------------------------------------------------------------------- the rules, on hand-made kernels

def test_a_compute_bound_kernel_moves_by_the_peak_of_its_unit():
    gemm = Work("gemm", "gemm", 40.0, flops=2 * 8192.0 ** 3, bytes=3 * 8192 ** 2 * 2, math="fp16")
    scaled = scale(gemm, SPEC["a100-80gb"], SPEC["h100-sxm"], IEEE, IEEE)
    assert scaled.rule == "roofline efficiency" and scaled.unit == "fp16"
    assert scaled.ms == pytest.approx(40.0 * _rate("a100-80gb", "fp16") / _rate("h100-sxm", "fp16"))
    # the same FLOPs in FP32 ride the FP32 SIMT peak, a different ratio
    fp32 = scale(Work("gemm", "gemm", 400.0, 2 * 8192.0 ** 3, 3 * 8192 ** 2 * 4, "fp32"),
                 SPEC["a100-80gb"], SPEC["h100-sxm"], IEEE, IEEE)
    assert fp32.ms == pytest.approx(400.0 * _rate("a100-80gb", "fp32") / _rate("h100-sxm", "fp32"))


def test_a_bandwidth_bound_kernel_moves_by_the_memory_bandwidth():
    add = Work("add", "elementwise", 5.0, flops=0.0, bytes=3e9)
    scaled = scale(add, SPEC["v100-pcie"], SPEC["a100-pcie-80gb"], IEEE, IEEE)
    assert scaled.rule == "roofline efficiency"
    assert scaled.ms == pytest.approx(5.0 * _bw("v100-pcie") / _bw("a100-pcie-80gb"))
    assert 5.0 * 900 / 1935 * 0.9 < scaled.ms < 5.0 * 900 / 1935 * 1.2  # measured fractions, near the datasheet ratio


def test_the_bound_that_binds_on_the_target_decides():
    """A GEMM of low arithmetic intensity is memory-bound on an H100 (3350 GB/s against 989 TFLOP/s)
    and compute-bound on a V100 in FP32 (900 GB/s against 15.7 TFLOP/s): the max of the two is kept."""
    work = Work("skinny gemm", "gemm", 1.0, flops=2 * 4096 * 4096 * 64.0, bytes=(4096 * 64 * 2 + 4096 * 4096) * 2.0,
                math="fp16")
    on_h100 = roofline_ms(work, SPEC["h100-sxm"], "fp16")
    assert on_h100 == pytest.approx(work.bytes / (_bw("h100-sxm") * 1e9) * 1e3)
    on_v100 = roofline_ms(Work("x", "gemm", 1.0, work.flops, work.bytes, "fp32"), SPEC["v100-sxm2"], "fp32")
    assert on_v100 == pytest.approx(work.flops / (_rate("v100-sxm2", "fp32") * 1e12) * 1e3)


def test_a_kernel_under_one_wave_follows_the_clock_only():
    small = Work("small", "gemm", 0.5, flops=1e9, bytes=1e6, math="fp16", blocks=SPEC["a100-80gb"].sms - 1)
    scaled = scale(small, SPEC["a100-80gb"], SPEC["h100-sxm"], IEEE, IEEE)
    assert scaled.rule == "one wave"
    assert scaled.ms == pytest.approx(0.5 * SPEC["a100-80gb"].boost_mhz / SPEC["h100-sxm"].boost_mhz)
    full = scale(Work("big", "gemm", 0.5, 1e9, 1e6, "fp16", blocks=SPEC["a100-80gb"].sms * 4),
                 SPEC["a100-80gb"], SPEC["h100-sxm"], IEEE, IEEE)
    assert full.rule == "roofline efficiency"


def test_launch_bound_kernels_and_host_time_are_not_scaled():
    tiny = scale(Work("tiny", "elementwise", FLOOR_MS / 2, bytes=1e3), SPEC["v100-sxm2"], SPEC["h200"], IEEE, IEEE)
    assert (tiny.ms, tiny.rule) == (FLOOR_MS / 2, "launch-bound")
    idle = scale(Work("idle", "host", 7.0), SPEC["v100-sxm2"], SPEC["h200"], IEEE, IEEE)
    assert (idle.ms, idle.rule) == (7.0, "host")
    nccl = scale(Work("allreduce", "communication", 3.0), SPEC["v100-sxm2"], SPEC["h200"], IEEE, IEEE)
    assert nccl.ms == 3.0


def test_without_flops_and_bytes_the_category_picks_peak_or_bandwidth_ratio():
    conv = scale(Work("conv", "conv", 10.0, math="fp16"), SPEC["v100-sxm2"], SPEC["a100-80gb"], IEEE, IEEE)
    assert conv.rule == "peak ratio"
    assert conv.ms == pytest.approx(10.0 * _rate("v100-sxm2", "fp16") / _rate("a100-80gb", "fp16"))
    norm = scale(Work("bn", "norm", 10.0), SPEC["v100-sxm2"], SPEC["a100-80gb"], IEEE, IEEE)
    assert norm.rule == "bandwidth ratio" and norm.ms == pytest.approx(10.0 * _bw("v100-sxm2") / _bw("a100-80gb"))


def test_an_op_without_source_time_gets_the_targets_roofline_and_at_least_a_kernels_minimum():
    big = Work("mm", "gemm", None, flops=1e12, bytes=1e6, math="bf16")
    priced = scale(big, SPEC["h100-sxm"], SPEC["h100-sxm"], IEEE, IEEE)
    assert priced.ms == pytest.approx(1e12 / (_rate("h100-sxm", "bf16") * 1e12) * 1e3)
    assert scale(Work("add", "elementwise", None, bytes=8.0), SPEC["l4"], SPEC["l4"], IEEE, IEEE).ms == KERNEL_MIN_MS


# --------------------------------------------------------------------------- TF32: what "FP32" means per architecture

@pytest.mark.parametrize("key, category, flags, unit", [
    ("a100-80gb", "conv", (False, True), "tf32"),  # PyTorch's default: cuDNN TF32 on ...
    ("a100-80gb", "gemm", (False, True), "fp32"),  # ... matmul TF32 off
    ("h100-sxm", "gemm", TF32, "tf32"), ("l4", "conv", TF32, "tf32"),
    ("v100-sxm2", "conv", (False, True), "fp32"),  # no TF32 before compute capability 8.0: the flag does nothing
    ("t4", "gemm", TF32, "fp32"), ("a100-80gb", "conv", IEEE, "fp32"),
    ("a100-80gb", "elementwise", TF32, None),  # memory-bound work has no math unit
])
def test_fp32_math_runs_on_tf32_only_where_allowed_and_only_from_ampere(key, category, flags, unit):
    assert math_unit(Work("w", category, 1.0, 1e9, 1e6, "fp32"), SPEC[key], flags) == unit


def test_16_bit_and_fp8_work_keep_their_unit_whatever_the_fp32_flags():
    assert math_unit(Work("w", "gemm", 1.0, 1e9, 1e6, "bf16"), SPEC["h100-sxm"], IEEE) == "bf16"
    assert math_unit(Work("w", "gemm", 1.0, 1e9, 1e6, "fp8"), SPEC["l4"], TF32) == "fp8"


# --------------------------------------------------------------------------- unsupported targets

def _case(gpu: str = "a100-80gb") -> CaseSource:
    works = [Work("gemm", "gemm", 2.0, 2 * 4096.0 ** 3, 1e8, "bf16"), Work("idle", "host", 1.0)]
    modes_ = {p: ModeSource(p, 3.0, 100.0, Path("unused"), IEEE, works=[Work(w.label, w.category, w.source_ms, w.flops,
                                                                              w.bytes, w.math) for w in works],
                            busy_ms=2.0, wall_ms=3.0) for p in ("fp32", "tf32", "amp_bf16", "amp_fp16", "fp8")}
    modes_["fp8"].works[0].math = "fp8"
    return CaseSource("toy bs 8", {"batch_size": 8}, SPEC[gpu].device_name, SPEC[gpu], modes_)


@pytest.mark.parametrize("precision, target, status, words", [
    ("amp_bf16", "v100-sxm2", "unsupported", ["8.0", "V100", "emulated"]),
    ("tf32", "t4", "unsupported", ["TF32", "8.0", "7.5"]),
    ("fp8", "a100-80gb", "unsupported", ["8.9", "8.0"]),
    ("fp8", "rtx-4090", "no prediction", ["FP8", "RTX 4090"]),  # cc 8.9, but no sourced dense FP8 rate
])
def test_a_target_that_cannot_run_the_mode_says_why(precision, target, status, words):
    predicted, got_status, why = predict_mode(_case(), precision, SPEC[target])
    assert predicted is None and got_status == status
    assert all(w in why for w in words), why


def test_a_supported_mode_is_predicted_and_the_source_gpu_predicts_itself():
    case = _case("h100-sxm")
    same, status, _ = predict_mode(case, "amp_bf16", SPEC["h100-sxm"])
    assert status == "ok" and same.step_ms == pytest.approx(3.0) and same.throughput == pytest.approx(100.0)
    slower, _, _ = predict_mode(case, "amp_bf16", SPEC["a100-80gb"])
    assert 3.0 < slower.step_ms < 3.0 + 2.0 * 989 / 312 + 1e-9  # the GEMM slows, the host second does not


# --------------------------------------------------------------------------- op costing from recorded shapes

def test_a_convolution_is_costed_from_its_concrete_stride_and_padding():
    cost = ops.op_cost("aten::convolution", [[8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
                       ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList",
                        "Scalar"],
                       ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"])
    assert cost.flops == 2 * 8 * 64 * 112 * 112 * 3 * 7 * 7 and cost.math == "fp32"
    back = ops.op_cost("aten::convolution_backward", [[8, 64, 112, 112], [8, 3, 224, 224], [64, 3, 7, 7]],
                       ["c10::BFloat16"] * 3, ["", "", "", "[0]", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]",
                                               "1", "[False, True, False]"])
    assert back.flops == cost.flops and back.math == "bf16"  # the weight gradient only: the mask says so


def test_an_nchw_convolution_pays_layout_transforms_only_on_tensor_cores():
    dims, types = [[64, 256, 56, 56], [256, 256, 1, 1]], ["c10::Half", "c10::Half"]
    nchw = ops.op_cost("aten::convolution", dims, types, strides=[[802816, 3136, 56, 1], [256, 1, 1, 1]])
    nhwc = ops.op_cost("aten::convolution", dims, types, strides=[[802816, 1, 14336, 256], [256, 1, 1, 1]])
    # input and output, there and back
    assert nhwc.nchw_bytes == 0 and nchw.nchw_bytes == 2 * (2 * 64 * 256 * 56 * 56 * 2)
    work = Work("conv", "conv", None, nchw.flops, nchw.bytes, "fp16", nchw_bytes=nchw.nchw_bytes)
    plain = Work("conv", "conv", None, nchw.flops, nchw.bytes, "fp16")
    on_a100 = scale(work, SPEC["a100-80gb"], SPEC["a100-80gb"], IEEE, IEEE)
    assert on_a100.ms == pytest.approx(scale(plain, SPEC["a100-80gb"], SPEC["a100-80gb"], IEEE, IEEE).ms
                                       + nchw.nchw_bytes / (_bw("a100-80gb") * 1e9) * 1e3)
    fp32 = Work("conv", "conv", None, nchw.flops, nchw.bytes * 2, "fp32", nchw_bytes=nchw.nchw_bytes * 2)
    # SIMT: no transform
    assert scale(fp32, SPEC["v100-sxm2"], SPEC["v100-sxm2"], IEEE, IEEE).rule == "roofline (inventory)"


def test_gemms_attention_and_memory_ops_are_costed_and_views_are_not():
    assert ops.op_cost("aten::addmm", [[1000], [8, 2048], [2048, 1000]], ["c10::Half"] * 3).flops == 2 * 8 * 2048 * 1000
    assert ops.op_cost("aten::bmm", [[12, 128, 64], [12, 64, 128]], ["float"] * 2).flops == 2 * 12 * 128 * 64 * 128
    sdpa = ops.op_cost("aten::_scaled_dot_product_flash_attention", [[2, 12, 128, 64]] * 3, ["c10::BFloat16"] * 3)
    assert sdpa.flops == 4 * 2 * 12 * 128 * 128 * 64
    relu = ops.op_cost("aten::relu_", [[8, 64, 56, 56]], ["float"])
    assert relu.flops == 0 and relu.bytes == 2 * 8 * 64 * 56 * 56 * 4 and relu.math is None
    assert ops.op_cost("aten::view", [[8, 64]], ["float"]) is None
    assert ops.op_cost("aten::_foreach_add_", [[], []], ["TensorList", "TensorList"]) is None


# --------------------------------------------------------------------------- the command, on stored runs

def test_predict_on_a_stored_cpu_run_predicts_its_suites_gpu_cases(capsys):
    """A run from a machine without a GPU says nothing of a GPU's time: its suite's GPU cases are recorded on
    fake tensors and priced (studies/gpu_predictions.py), every mode on its own, never borrowed."""
    assert main(["predict", str(DATA / "cpu_run"), "--target", "h100-sxm,a100-80gb,l4,v100-sxm2"]) == 0
    out = capsys.readouterr().out
    assert "resnet18 bs 4" in out and "recorded on fake tensors" in out and "gpt2-tiny" in out
    assert "unsupported" in out and "bf16 needs compute capability >= 8.0" in out
    assert "Predicted, nothing measured on a GPU" in out and "at the median" in out
    table = predict_source(DATA / "cpu_run", ["h100-sxm", "v100-sxm2"]).table
    resnet = table[table["case"].str.startswith("resnet18")].set_index(["target", "precision"])
    assert set(resnet.loc["h100-sxm"].index) == {"fp32", "tf32", "amp_fp16", "amp_bf16"}
    ok = resnet[resnet["status"] == "ok"]
    assert (ok["interval_from"] == "recorded").all()
    assert ((ok["step_ms_low"] < ok["step_ms"]) & (ok["step_ms"] < ok["step_ms_high"])).all()
    low, high = INTERVALS["recorded"]
    assert ok["step_ms_high"].div(ok["step_ms"]).sub(high).abs().max() < 1e-9
    assert resnet.loc[("v100-sxm2", "amp_bf16"), "status"] == "unsupported"


def test_predict_reads_the_targets_from_the_suites_predict_block(capsys):
    assert main(["predict", str(DATA / "cpu_run")]) == 0  # the fixture's suite.yaml names four targets
    out = capsys.readouterr().out
    assert all(label in out for label in ("H100 SXM 80GB", "A100 SXM 80GB", "L4", "V100 SXM2"))


def test_predict_on_a_stored_gpu_trace_needs_the_gpu_named_then_scales_its_kernels(capsys):
    assert main(["predict", str(DATA / "gpu_run"), "--target", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "results.csv" in err and "device_name 'NVIDIA A100-PG509-200'" in err and "--source-gpu" in err
    assert "Traceback" not in err
    result = predict_run(DATA / "gpu_run", ["a100-40gb", "h100-sxm", "v100-sxm2", "l4"], source_gpu="a100-40gb")
    table = result.table.set_index("target")
    measured = pd.read_csv(DATA / "gpu_run" / "results.csv")["step_time_ms_median"].iloc[0]
    assert table.loc["a100-40gb", "step_ms"] == pytest.approx(measured)  # the source predicts itself
    assert table.loc["h100-sxm", "step_ms"] < measured < table.loc["l4", "step_ms"]
    assert table.loc["v100-sxm2", "status"] == "unsupported"  # the run is TF32
    parts = result.breakdown[result.breakdown["target"] == "h100-sxm"].set_index("category")
    assert parts.loc["host", "target_ms"] == parts.loc["host", "source_ms"] > 0
    assert parts.loc["gemm", "target_ms"] < parts.loc["gemm", "source_ms"]


def test_bad_input_is_one_line_naming_the_file_and_field(tmp_path, capsys):
    assert main(["predict", str(tmp_path), "--target", "h100-sxm"]) == 2
    assert "no results.csv" in capsys.readouterr().err
    assert main(["predict", str(DATA / "cpu_run"), "--target", "h100"]) == 2
    assert "--target: unknown GPU 'h100'" in capsys.readouterr().err
    run = tmp_path / "run"
    shutil.copytree(DATA / "cpu_run", run)
    (run / "suite.yaml").write_text("predict:\n  targets: [h100-sxm, b300]\n")
    assert main(["predict", str(run)]) == 2
    err = capsys.readouterr().err
    assert "suite.yaml: predict.targets[1]: unknown GPU 'b300'" in err and err.count("\n") == 1


def test_every_spec_is_dense_sourced_and_findable_by_its_torch_name(capsys):
    for spec in SPECS:
        peaks, source = spec.peaks()
        assert peaks and source and spec.source and spec.bandwidth_gbs > 0
        assert find(spec.device_name) is spec and find(spec.key) is spec
        if "fp8" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=0.02)  # dense FP8 ~2x dense FP16, never 4x
    assert find("Tesla V100-SXM2-32GB") is SPEC["v100-sxm2"] and find("NVIDIA B200") is None
    assert main(["predict", "--list-targets"]) == 0
    assert "h100-pcie" in capsys.readouterr().out


def test_predicting_and_its_report_section_import_no_torch():
    import json
    import subprocess
    import sys
    code = ("import json, sys, amp_bench.analysis.predict.model, amp_bench.analysis.predict.neusight, "
            "amp_bench.report.predict_section, amp_bench.cli.predict; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == []


def test_the_suites_predict_block_is_checked_when_the_suite_loads(write_suite):
    from amp_bench.errors import SuiteError
    from amp_bench.suite import load_suite
    good = write_suite("models: ['python:toy_models:mlp']\nbatch_sizes: [4]\n"
                       "predict: {targets: [h100-sxm, l4], fp32_as: pytorch-default}\n")
    assert load_suite(good).predict == {"targets": ["h100-sxm", "l4"], "fp32_as": "pytorch-default"}
    bad = write_suite("models: ['python:toy_models:mlp']\nbatch_sizes: [4]\npredict: {targets: [H100], colour: red}\n",
                      "bad.yaml")
    with pytest.raises(SuiteError) as caught:
        load_suite(bad)
    text = "\n".join(caught.value.lines)
    assert "bad.yaml: predict.targets[0]: expected a GPU key" in text and "predict" in text and "colour" in text


@pytest.mark.slow
def test_predict_on_a_real_cpu_run_of_the_smoke_suite(smoke_run, capsys):
    _, out = smoke_run
    run = next(p for p in (out / "results").iterdir() if (p / "results.csv").is_file())
    assert main(["predict", str(run), "--target", "h100-sxm,v100-sxm2"]) == 0
    printed = capsys.readouterr().out
    assert "resnet18 bs 4" in printed and "gpt2-tiny bs 4" in printed and "unsupported" in printed
