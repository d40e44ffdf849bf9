"""Real-GPU checks (pytest -m gpu). They skip cleanly on a machine without CUDA. Sized for the GPU
check's part 2 (scripts/gpu_check.sh, about 80 s on an H200): one smoke model in 2 precisions, one
DDP launch; a world size the machine cannot hold is a CPU unit test (tests/test_distributed.py)."""
import os

import pytest
import torch

import amp_bench
from amp_bench.measure.precision import autocast_region, set_fp32_math
from amp_bench.measure.step import TrainStep, build_optimizer
from amp_bench.measure.window import CudaStepTimer
from amp_bench.modes import get as get_mode
from amp_bench.suite import OptimizerSpec
from conftest import ROOT

pytestmark = pytest.mark.gpu


def _capability():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


def _relative_error(op, a_shape=(1024, 1024), b_shape=(1024, 1024)):
    torch.manual_seed(0)
    a, b = torch.randn(*a_shape, device="cuda"), torch.randn(*b_shape, device="cuda")
    got = op(a, b).double()
    ref = op(a.double(), b.double())
    return ((got - ref).norm() / ref.norm()).item()


@pytest.fixture
def strict_fp32_after():
    yield
    set_fp32_math("ieee")


def _conv(x, w):  # 3x3, 64 -> 64 channels: cuDNN's tensor-core (TF32) kernels apply from about here
    return torch.nn.functional.conv2d(x, w, padding=1)


CONV_SHAPES = ((8, 64, 56, 56), (64, 64, 3, 3))


def test_fp32_is_strict_ieee_and_tf32_is_tf32(strict_fp32_after):
    from amp_bench.measure.precision import fp32_math_problems, read_fp32_math_flags
    set_fp32_math("ieee")
    assert fp32_math_problems("ieee", read_fp32_math_flags(), os.environ) == []  # as resolved
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: conv and RNN set explicitly, not inherited
        assert torch.backends.cudnn.conv.fp32_precision == "ieee" == torch.backends.cudnn.rnn.fp32_precision
    assert _relative_error(torch.matmul) < 1e-5
    assert _relative_error(_conv, *CONV_SHAPES) < 3e-5  # cuDNN's TF32 default is really off
    if _capability() >= (8, 0):
        set_fp32_math("tf32")
        assert fp32_math_problems("tf32", read_fp32_math_flags(), os.environ) == []
        if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: the per-operator setting resolves to tf32
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
        assert _relative_error(torch.matmul) > 1e-4
        assert _relative_error(_conv, *CONV_SHAPES) > 1e-4


@pytest.mark.parametrize("name, dtype", [("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)])
def test_autocast_engages_on_cuda(name, dtype):
    if name == "amp_bf16" and _capability() < (8, 0):
        pytest.skip("bf16 needs compute capability >= 8.0")
    with autocast_region(get_mode(name), "cuda"):
        out = torch.nn.functional.linear(torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda"))
    assert out.dtype == dtype


def test_cuda_timer_with_real_events():
    x = torch.randn(2048, 2048, device="cuda")
    timer = CudaStepTimer(lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize, steps=5)
    timer.begin_window()
    for _ in range(5):
        timer.step_started()
        for _ in range(10):
            x = torch.tanh(x @ x / 2048)
        timer.step_ended()
    per_step, window = timer.end_window()
    assert len(per_step) == 5 and all(t > 0 for t in per_step)
    assert sum(per_step) / 1e3 <= window * 1.05


def test_grad_scaler_skips_on_cuda():
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    from toy_models import inf_grad
    model, make_batch, loss_fn = inf_grad(at_steps=(1,))
    model = model.cuda()
    step = TrainStep(model, loss_fn, build_optimizer(model.parameters(), OptimizerSpec("adamw", "fused", 1e-3, 0.0)),
                     get_mode("amp_fp16"), "cuda")
    x, y = make_batch(8, torch.device("cuda"))
    for _ in range(4):
        step(x, y)
    assert step.skipped_steps() == [1] and step.output_dtype == torch.float16


def test_smoke_suite_on_cuda(tmp_path):
    """The smoke suite's transformers model in fp32 and amp_fp16 (two workers): the ResNet path runs in
    DDP below and in the check's part 1."""
    smoke = (ROOT / "suites" / "smoke.yaml").read_text()
    suite = tmp_path / "smoke.yaml"
    suite.write_text(smoke.replace("  - torchvision/resnet18\n", "", 1))
    results = amp_bench.run_suite(suite, device="cuda", results_dir=tmp_path / "results",
                                  # part 2's suite checks explain
                                  precisions=["fp32", "amp_fp16"], repeats=1, explain=False)
    by = results.set_index(["model_label", "precision"])
    assert len(results) == 2
    model = "gpt2-tiny"
    assert by.loc[(model, "fp32"), "status"] == "ok", by.loc[(model, "fp32"), "reason"]
    assert by.loc[(model, "fp32"), "peak_mem_allocated_bytes"] > 0
    assert by.loc[(model, "amp_fp16"), "status"] == "ok", by.loc[(model, "amp_fp16"), "reason"]
    assert by.loc[(model, "amp_fp16"), "output_dtype"] == "float16"
    # the settle step ran, and the smoke suite's foreach SGD pays GradScaler's per-step sync
    assert by.loc[(model, "fp32"), "settle_steps"] == 1
    assert by.loc[(model, "amp_fp16"), "scaler_host_sync"] and not by.loc[(model, "fp32"), "scaler_host_sync"]


def test_ddp_world_size_one_runs_nccl_on_cuda(tmp_path):
    """The NCCL path in one torchrun launch: one rank, DDP-wrapped model, autocast and GradScaler as
    usual. (A world size the machine cannot hold: tests/test_distributed.py, on the CPU.)"""
    suite = tmp_path / "ddp.yaml"
    suite.write_text("models: [{ref: torchvision/resnet18}]\nimage_size: 64\nbatch_sizes: [8]\n"
                     "precisions: [amp_fp16]\nwarmup_steps: 3\nsteps: 5\ntimeout_s: 240\n"
                     "nproc_per_node: [1]\n")
    results = amp_bench.run_suite(suite, device="cuda", results_dir=tmp_path / "results", explain=False)
    assert len(results) == 1
    row = results.iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert row["world_size"] == 1 and row["dist_backend"] == "nccl" and row["peak_mem_allocated_bytes"] > 0
    assert row["throughput"] > 0 and row["output_dtype"] == "float16"


def test_the_uuid_torch_gives_is_the_one_nvml_gives():
    """The fingerprint takes the UUID from torch when NVML is missing: it must be NVML's very string."""
    from amp_bench.platform.device import probe_device
    from amp_bench.platform.nvml import load_nvml
    nvml = load_nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(0) if "CUDA_VISIBLE_DEVICES" not in os.environ else None
    if handle is None:
        pytest.skip("CUDA_VISIBLE_DEVICES remaps indices: the NVML index may name another GPU")
    uuid = nvml.nvmlDeviceGetUUID(handle)
    assert probe_device("cuda:0").uuid == (uuid.decode() if isinstance(uuid, bytes) else uuid)


def _nvml_reader():
    from amp_bench.platform.nvml import NvmlReader, cuda_identity, device_handle, load_nvml
    nvml = load_nvml()
    handle, note = device_handle(nvml, *cuda_identity(0))
    assert note == "", note  # the UUID (or PCI bus id) matched: NVML reads this very GPU
    return NvmlReader(nvml, handle)


def test_a_known_allocation_shows_in_torch_and_nvml_peaks():
    from amp_bench.platform.nvml import NvmlSampler
    torch.cuda.init()
    reader = _nvml_reader()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline_torch = torch.cuda.memory_allocated()
    baseline_nvml = reader.memory_used()
    sampler = NvmlSampler(reader, interval_s=0.005)
    sampler.start()
    block = torch.ones(2**28, device="cuda")  # 1 GiB of float32, written
    torch.cuda.synchronize()
    import time
    time.sleep(0.2)
    out = sampler.stop(baseline_nvml, steps=1, samples=1)
    torch_peak = torch.cuda.max_memory_allocated() - baseline_torch
    del block
    assert torch_peak == pytest.approx(2**30, rel=0.10)
    assert out["nvml_mem_used_delta_bytes"] == pytest.approx(2**30, rel=0.10), out


def test_energy_and_clocks_are_read_during_real_work():
    from amp_bench.platform.nvml import NvmlSampler
    reader = _nvml_reader()
    sampler = NvmlSampler(reader, interval_s=0.01)
    x = torch.randn(8192, 8192, device="cuda")
    sampler.start()
    import time
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # 2 s of matmuls: long enough for the energy counter
        x = torch.tanh(x @ x / 8192)
        torch.cuda.synchronize()
    out = sampler.stop(None, steps=1, samples=1)
    assert out["sm_clock_mhz_median"] and out["sm_clock_mhz_median"] > 0
    assert out["temperature_c_max"] is not None and out["power_limit_w"]
    if "energy" not in reader.unsupported:  # Volta and later have the counter
        assert out["energy_j"] > 0 and out["power_avg_w"] > 10
    assert out["clock_event_reasons"] is not None
