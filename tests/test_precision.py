"""Each precision mode really changes dtypes and the TF32 flags; autocast proof catches a silent no-op."""
import dataclasses

import pytest
import torch

from amp_bench import modes
from amp_bench.measure.precision import (
    autocast_engages,
    autocast_region,
    make_grad_scaler,
    read_fp32_math_flags,
    set_fp32_math,
)
from amp_bench.modes import get as get_mode


@pytest.fixture(autouse=True)
def restore_flags():
    yield
    if hasattr(torch.backends, "fp32_precision"):
        torch.backends.fp32_precision = "none"
        torch.backends.cudnn.fp32_precision = "none"
    set_fp32_math("ieee")


@pytest.mark.parametrize("name, dtype", [("fp32", torch.float32), ("tf32", torch.float32),
                                         ("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)])
def test_mode_changes_the_compute_dtype(name, dtype):
    mode = get_mode(name)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with autocast_region(mode, "cpu"):
        linear = torch.nn.functional.linear(x, w)
        conv = torch.nn.functional.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))
    assert linear.dtype == dtype
    assert conv.dtype == dtype
    assert autocast_engages(mode, "cpu") == (True, "")


@pytest.mark.parametrize("name, tf32", [("fp32", False), ("tf32", True), ("amp_fp16", False), ("amp_bf16", False)])
def test_mode_sets_tf32_for_matmul_and_cudnn(name, tf32):
    set_fp32_math("tf32" if not tf32 else "ieee")  # start from the opposite state
    set_fp32_math(get_mode(name).fp32_math)
    flags = read_fp32_math_flags()
    assert flags["tf32_matmul"] is tf32
    assert flags["tf32_cudnn"] is tf32  # cuDNN's TF32 defaults on: fp32 must turn it off too
    assert flags["float32_matmul_precision"] == ("high" if tf32 else "highest")
    if flags["fp32_precision_matmul"]:  # torch >= 2.9: the newer API agrees
        assert flags["fp32_precision_matmul"] == ("tf32" if tf32 else "ieee")
        assert (flags["fp32_precision_cudnn_conv"] == "tf32") is tf32
        assert (flags["fp32_precision_cudnn_rnn"] == "tf32") is tf32


def test_flags_stay_readable_through_both_apis_after_every_mode():
    for name in ("tf32", "fp32"):
        set_fp32_math(get_mode(name).fp32_math)
        # user code, libraries and inductor may read either API: neither read may raise
        assert isinstance(torch.backends.cuda.matmul.allow_tf32, bool)
        assert isinstance(torch.backends.cudnn.allow_tf32, bool)
        torch.get_float32_matmul_precision()
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            assert torch.backends.cuda.matmul.fp32_precision in ("ieee", "tf32")


def test_grad_scaler_only_for_fp16():
    assert [n for n in modes.names() if make_grad_scaler(get_mode(n), "cpu").is_enabled()] == ["amp_fp16"]


def test_autocast_proof_detects_a_silently_disabled_region():
    fake = dataclasses.replace(get_mode("amp_bf16"), autocast_dtype="float64")  # CPU autocast ignores float64
    engaged, why = autocast_engages(fake, "cpu")
    assert not engaged
    assert "did not engage" in why or "failed" in why


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown precision 'fp4'"):
        get_mode("fp4")


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9 has no per-backend API")
@pytest.mark.parametrize("level", ["generic", "cudnn"])
def test_strict_fp32_holds_for_conv_and_rnn_when_a_higher_level_says_tf32(level):
    """The legacy allow_tf32=False writes "none" for cuDNN conv/RNN, which inherits a backend- or
    generic-level tf32 (a library may set one): set_fp32_math sets both explicitly."""
    from amp_bench.measure.precision import fp32_math_problems
    if level == "generic":
        torch.backends.fp32_precision = "tf32"
    else:
        torch.backends.cudnn.fp32_precision = "tf32"
    set_fp32_math("ieee")
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    flags = read_fp32_math_flags()
    assert flags["tf32_cudnn"] is False
    assert fp32_math_problems("ieee", flags) == []


@pytest.mark.parametrize("fp32_math, flags, env, expected", [
    ("ieee", {"tf32_matmul": False, "tf32_cudnn": False, "fp32_precision_cudnn_rnn": "tf32"}, {},
     "cuDNN RNN fp32_precision resolves to tf32"),
    ("ieee", {"tf32_matmul": False, "tf32_cudnn": True}, {}, "cuDNN resolves to TF32"),
    ("ieee", {"tf32_matmul": False, "tf32_cudnn": None}, {}, "cuDNN: the TF32 flag cannot be read"),
    ("ieee", {"tf32_matmul": False, "tf32_cudnn": False, "float32_matmul_precision": "high"}, {},
     "float32_matmul_precision is high"),
    ("ieee", {"tf32_matmul": False, "tf32_cudnn": False}, {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"},
     "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"),
    ("tf32", {"tf32_matmul": True, "tf32_cudnn": True}, {"NVIDIA_TF32_OVERRIDE": "0"}, "NVIDIA_TF32_OVERRIDE=0"),
    ("tf32", {"tf32_matmul": False, "tf32_cudnn": True}, {}, "matmul (cuBLAS) resolves to IEEE FP32"),
])
def test_fp32_math_problems_name_what_would_change_the_math(fp32_math, flags, env, expected):
    from amp_bench.measure.precision import fp32_math_problems
    problems = fp32_math_problems(fp32_math, flags, env)
    assert len(problems) == 1 and expected in problems[0], problems
    clean = {"tf32_matmul": fp32_math == "tf32", "tf32_cudnn": fp32_math == "tf32"}
    assert fp32_math_problems(fp32_math, clean, {}) == []


def test_a_case_whose_fp32_would_still_run_tf32_errors(monkeypatch):
    """prepare_case checks the flags as they resolved; here the write is lost (as if a library
    turned cuDNN's TF32 back on) and the fp32 case must fail with a one-line reason."""
    from amp_bench.measure import precision
    from amp_bench.measure.case import prepare_case
    from amp_bench.platform.device import DeviceInfo, precision_support
    from amp_bench.suite import Case, ModelSpec, OptimizerSpec

    case = Case(suite="s", model=ModelSpec(ref="python:toy_models:mlp", label="mlp"), batch_size=2, precision="fp32",
                channels_last=False, image_size=None, seq_len=None, warmup_steps=0, steps=1, repeats=1,
                optimizer=OptimizerSpec(), seed=0, timeout_s=60, allow_emulated=False)
    torch.backends.cudnn.allow_tf32 = True
    monkeypatch.setattr(precision, "set_fp32_math", lambda fp32_math: None)
    message = "fp32 needs strict IEEE FP32 outside autocast, but cuDNN"
    with pytest.raises(precision.Fp32MathError, match=message) as info:
        prepare_case(case, DeviceInfo("cpu", "cpu"), {}, precision_support(case.precision, DeviceInfo("cpu", "cpu")))
    assert "\n" not in str(info.value)
    monkeypatch.undo()
    record = {}
    prepare_case(case, DeviceInfo("cpu", "cpu"), record,  # the real write: strict, and recorded so
                 precision_support(case.precision, DeviceInfo("cpu", "cpu")))
    assert record["tf32_cudnn"] is False


def test_a_cuda_run_says_in_one_line_what_a_tf32_override_does_and_how_to_clear_it(monkeypatch):
    """NVIDIA's NGC containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: every IEEE mode is then refused
    case by case; the run says why once, at its start, with the command that clears it."""
    from types import SimpleNamespace

    from rich.console import Console

    from amp_bench.cli.console import rich_reporter
    from amp_bench.platform.device import DeviceInfo
    monkeypatch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    for device, said in ((DeviceInfo("cuda", "NVIDIA H200", index=0, capability=(9, 0)), True),
                         (DeviceInfo("cpu", "AMD EPYC"), False)):  # it changes nothing on a CPU
        console = Console(record=True, width=300)
        reporter = rich_reporter(console)
        reporter.run_started(SimpleNamespace(dir="results/x"), device, 1)
        reporter.close()
        notes = [line for line in console.export_text().splitlines() if line.startswith("note:")]
        assert len(notes) == int(said), notes
        if said:
            assert "makes cuBLAS use TF32 whatever the flags say" in notes[0]
            assert "`unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`" in notes[0]
