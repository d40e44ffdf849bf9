"""Each precision mode really changes dtypes and the TF32 flags; autocast proof catches a silent no-op."""
import pytest
import torch

from amp_bench import modes
from amp_bench.precision import (autocast_engages, autocast_region, get_mode, make_grad_scaler,
                                 read_fp32_math_flags, set_fp32_math)


@pytest.fixture(autouse=True)
def restore_flags():
    yield
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
    fake = get_mode("amp_bf16").__class__("amp_f64", torch.float64, False, "ieee")  # CPU autocast ignores float64
    engaged, why = autocast_engages(fake, "cpu")
    assert not engaged
    assert "did not engage" in why or "failed" in why


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        get_mode("fp8")
