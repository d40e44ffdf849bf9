"""Per-phase memory and FLOP counting run for real on the CPU; peak table, MFU and fingerprints."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from amp_bench.measure.step import TrainStep, build_optimizer
from amp_bench.measure.telemetry.flops import count_step_flops, flops_columns
from amp_bench.measure.telemetry.phase_memory import PHASES, CpuPhaseProbe, CudaPhaseProbe, phase_columns
from amp_bench.modes import get as get_mode
from amp_bench.platform.peaks import peak_tflops
from amp_bench.store.fingerprint import fingerprint_columns
from amp_bench.suite import OptimizerSpec
from conftest import ROOT


def mlp_step(precision="fp32", batch=8):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    step = TrainStep(model, torch.nn.functional.cross_entropy,
                     build_optimizer(model.parameters(), OptimizerSpec()), get_mode(precision), "cpu")
    return step, torch.randn(batch, 64), torch.randint(0, 10, (batch,))


def test_flops_of_a_known_model_match_a_hand_count():
    step, x, y = mlp_step(batch=8)
    b = 8
    forward = 2 * b * 64 * 32 + 2 * b * 32 * 10
    # backward: weight grads of both layers, input grad of the second only (x needs no grad)
    backward = 2 * b * 64 * 32 + 2 * (2 * b * 32 * 10)
    assert count_step_flops(step, x, y) == forward + backward


def test_mfu_only_with_a_known_peak():
    cols = flops_columns(2e12, 10.0, 989.0, "datasheet")
    assert cols["achieved_tflops"] == pytest.approx(200.0) and cols["mfu"] == pytest.approx(200 / 989)
    assert flops_columns(2e12, 10.0, None, "unknown")["mfu"] is None


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H200", "amp_bf16", 989.0), ("NVIDIA H100 80GB HBM3", "tf32", 495.0),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5), ("Tesla V100-SXM2-16GB", "amp_fp16", 125.0),
    ("NVIDIA A10", "amp_bf16", 125.0), ("NVIDIA L4", "amp_fp16", 121.0),
])
def test_peak_table(name, precision, peak):
    assert peak_tflops(name, precision)[0] == peak


@pytest.mark.parametrize("name, precision", [
    ("NVIDIA H100 PCIe", "amp_bf16"), ("NVIDIA A10G", "amp_fp16"), ("NVIDIA H200 NVL", "amp_bf16"),
    ("Tesla V100-SXM2-16GB", "amp_bf16"), ("AMD EPYC", "fp32"),
])
def test_unknown_variants_get_no_guess(name, precision):
    value, why = peak_tflops(name, precision)
    assert value is None and why


def test_cpu_phase_memory_for_real():
    probe = CpuPhaseProbe()
    if not probe.available():
        pytest.skip("this kernel does not allow resetting the RSS high-water mark")
    step, x, y = mlp_step()
    step(x, y, marks=probe.mark)
    columns = phase_columns(probe)
    assert columns["phase_memory_source"] == "cpu_rss_hwm"
    assert all(columns[f"peak_mem_{p}_bytes"] > 10e6 for p in PHASES)


def test_one_counted_step_also_serves_the_phase_probe():
    """The FLOP count and the per-phase memory share one step after the window: the count is the same as
    an unmarked step's, and every phase got its peak."""
    step, x, y = mlp_step()
    marked = []
    assert count_step_flops(step, x, y, marks=marked.append) == count_step_flops(step, x, y)
    assert marked[0] == "forward" and set(PHASES) <= set(marked)


def test_cpu_phase_probe_sees_a_big_allocation_in_its_phase():
    probe = CpuPhaseProbe()
    if not probe.available():
        pytest.skip("this kernel does not allow resetting the RSS high-water mark")
    probe.mark("forward")
    big = torch.ones(64 * 2**20)  # 256 MiB, touched
    del big
    probe.mark("backward")
    probe.mark("end")
    assert probe.peaks["forward"] - probe.peaks["backward"] > 200 * 2**20 or \
        probe.peaks["forward"] > 256 * 2**20


class FakeCuda:
    """Replays allocator peaks the way torch.cuda reports them."""
    def __init__(self, peaks):
        self.peaks, self.calls = list(peaks), []

    def synchronize(self, device=None):
        self.calls.append("sync")

    def max_memory_allocated(self, device=None):
        return self.peaks.pop(0)

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset")


def test_cuda_phase_probe_resets_and_reads_at_each_boundary():
    fake = FakeCuda([3 * 2**30, 5 * 2**30, 4 * 2**30])
    probe = CudaPhaseProbe("cuda:0", cuda=fake)
    for phase in ("forward", "backward", "optimizer", "end"):
        probe.mark(phase)
    assert probe.peaks == {"forward": 3 * 2**30, "backward": 5 * 2**30, "optimizer": 4 * 2**30}
    assert fake.calls.count("sync") == 4 and fake.calls.count("reset") == 4


def test_fingerprint_changes_with_what_makes_results_incomparable():
    device = {"name": "NVIDIA H200", "capability": [9, 0], "total_memory_bytes": 150e9, "cpu_model": "Xeon",
              "cpu_flags": ["amx_bf16", "avx2"]}
    versions = {"torch_version": "2.11.0", "torch_cuda_version": "13.0"}
    gpu = {"gpu_uuid": "GPU-1", "driver_version": "590.10"}
    base = fingerprint_columns(device, versions, gpu, "node-a")
    assert base["compute_capability"] == "9.0" and base["cpu_bf16_isa"] == "amx_bf16"
    assert fingerprint_columns(device, versions, gpu, "node-a")["fingerprint"] == base["fingerprint"]
    for changed in (fingerprint_columns(device, {**versions, "torch_version": "2.14.1"}, gpu, "node-a"),
                    fingerprint_columns(device, versions, {**gpu, "driver_version": "600.1"}, "node-a"),
                    fingerprint_columns(device, versions, gpu, "node-b")):
        assert changed["fingerprint"] != base["fingerprint"]


def test_two_gpus_of_one_node_differ_without_nvml_by_the_uuid_torch_gives(monkeypatch):
    """No NVML (a container without the library): the UUID comes from torch's device properties, in
    NVML's form, so two SLURM jobs on different GPUs of one node are two series."""
    from amp_bench.platform import nvml
    from amp_bench.platform.device import DeviceInfo, nvml_uuid
    from amp_bench.platform.provenance import gpu_facts
    assert nvml_uuid("5c4b3f1e-0000-4000-8000-000000000001") == "GPU-5c4b3f1e-0000-4000-8000-000000000001"
    assert nvml_uuid("MIG-abc") == "MIG-abc" and nvml_uuid("") == ""

    def no_nvml():
        raise RuntimeError("NVML Shared Library Not Found")
    monkeypatch.setattr(nvml, "load_nvml", no_nvml)
    facts = [gpu_facts(DeviceInfo("cuda", "NVIDIA H200", index=i, capability=(9, 0), uuid=f"GPU-{i}")) for i in (0, 1)]
    assert [f["gpu_uuid"] for f in facts] == ["GPU-0", "GPU-1"] and facts[0]["nvml"].startswith("NVML Shared")
    device = {"name": "NVIDIA H200", "capability": [9, 0]}
    prints = {fingerprint_columns({**device, "uuid": f"GPU-{i}"}, {}, {}, "node-a")["fingerprint"] for i in (0, 1)}
    assert len(prints) == 2


def test_the_conda_export_is_bounded_and_can_be_skipped(monkeypatch, tmp_path):
    """`conda env export` can take minutes on a conda image: it is cut at its timeout (the record says
    so) and skipped with AMP_BENCH_CONDA_EXPORT=0, which the GPU check sets."""
    from amp_bench.platform import provenance
    slow = tmp_path / "conda"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CONDA_PREFIX", str(tmp_path))
    started = time.monotonic()
    assert provenance.conda_export(timeout_s=0.5) == "not recorded (`conda env export` failed or took over 0 s)"
    assert time.monotonic() - started < 10
    monkeypatch.setenv("AMP_BENCH_CONDA_EXPORT", "0")
    started = time.monotonic()
    assert provenance.software_record()["conda_env"] == "not recorded (AMP_BENCH_CONDA_EXPORT=0)"


def test_env_json_has_the_record():
    proc = subprocess.run([sys.executable, "-m", "amp_bench", "env", "--device", "cpu", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["device"]["type"] == "cpu" and info["fingerprint"]["fingerprint"]
    assert info["versions"]["torch_version"] == torch.__version__
    assert info["software"]["pip_freeze"] and "support" in info
    assert "cpu_bf16_isa" in info["fingerprint"]


def test_environment_record_has_allocator_module_loading_device_order_and_nccl(monkeypatch):
    from amp_bench.platform.provenance import host_facts
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_MODULE_LOADING", "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE",
                "NCCL_DEBUG", "NCCLX_UNRELATED", "HOME_NCCL_"):
        monkeypatch.setenv(key, "x")
    env = host_facts()["env"]
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_MODULE_LOADING", "CUDA_DEVICE_ORDER", "NCCL_P2P_DISABLE",
                "NCCL_DEBUG"):
        assert env[key] == "x", key
    assert "NCCLX_UNRELATED" not in env and "HOME_NCCL_" not in env


class _CompiledLike(torch.nn.Module):
    """Stands in for torch.compile's wrapper: the original module as `_orig_mod`, and a call whose
    kernels the FLOP counter cannot see (here: it records the call and counts as nothing)."""

    def __init__(self, module):
        super().__init__()
        self._orig_mod = module
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        with torch.no_grad():
            out = self._orig_mod(x)
        return out.requires_grad_()  # no matmul in the graph the counter sees, like a Triton template


def test_flops_of_a_compiled_model_are_counted_on_its_original_module():
    step, x, y = mlp_step(batch=8)
    eager = count_step_flops(step, x, y)
    wrapper = _CompiledLike(step.model)
    step.model = wrapper
    assert count_step_flops(step, x, y) == eager
    assert wrapper.calls == 0 and step.model is wrapper  # the wrapper is put back for the timed steps
    step.model = torch.compile(wrapper._orig_mod, backend="eager")
    assert count_step_flops(step, x, y) == eager


def test_mfu_on_the_bf16_basis_beside_the_modes_own():
    cols = flops_columns(2e12, 10.0, 1979.0, "fp8 dense peak: datasheet", bf16_peak=989.0)
    assert cols["mfu"] == pytest.approx(200 / 1979) and cols["mfu_bf16_basis"] == pytest.approx(200 / 989)
    assert flops_columns(2e12, 10.0, 19.5, "fp32 dense peak")["mfu_bf16_basis"] is None  # no bf16 peak known


def test_the_package_record_lists_what_pip_freeze_lists():
    """The software record reads the packages' metadata instead of starting pip: the same pinned lines."""
    import subprocess

    from amp_bench.platform.provenance import installed_packages
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    pinned = {line.lower() for line in freeze if "==" in line and not line.startswith("#")}
    ours = installed_packages()
    assert pinned and pinned == {line.lower() for line in ours if "==" in line}
    assert not any(line.split("==")[0] in ("pip", "setuptools") for line in ours)
