"""Hardware gating, tested with fakes that replay what real GPUs and CPUs report."""
import pytest

from amp_bench.platform.device import (
    DeviceInfo,
    DeviceUnavailable,
    may_run,
    precision_support,
    probe_device,
    read_cpu_info,
)


@pytest.fixture(autouse=True)
def no_onednn_isa_cap(monkeypatch):
    """These tests give the CPU's flags explicitly; a cap in the environment (ONEDNN_MAX_CPU_ISA, as
    used to emulate a CPU without bf16) would hide some of them. test_guardrails tests the cap."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


class FakeCuda:
    def __init__(self, name=None, capability=None, memory=80 * 2**30):
        self.gpu = (name, capability, memory) if name else None

    def is_available(self):
        return self.gpu is not None

    def device_count(self):
        return 1 if self.gpu else 0

    def properties(self, index):
        return self.gpu

    def uuid(self, index):
        return "GPU-5c4b3f1e-0000-4000-8000-000000000001" if self.gpu else ""


GPUS = {  # name, compute capability: what torch.cuda.get_device_properties reports
    "P100": ("Tesla P100-PCIE-16GB", (6, 0)),
    "V100": ("Tesla V100-SXM2-16GB", (7, 0)),
    "T4": ("Tesla T4", (7, 5)),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0)),
    "L4": ("NVIDIA L4", (8, 9)),
    "H200": ("NVIDIA H200", (9, 0)),
}


def gpu(key):
    name, cc = GPUS[key]
    return probe_device("cuda", cuda=FakeCuda(name, cc), cpu_info=("Xeon", frozenset()))


@pytest.mark.parametrize("key, arch, supported", [
    ("P100", "Pascal", {"fp32"}),
    ("V100", "Volta", {"fp32", "amp_fp16"}),
    ("T4", "Turing", {"fp32", "amp_fp16"}),
    ("A100", "Ampere", {"fp32", "tf32", "amp_fp16", "amp_bf16"}),
    ("L4", "Ada", {"fp32", "tf32", "amp_fp16", "amp_bf16"}),
    ("H200", "Hopper", {"fp32", "tf32", "amp_fp16", "amp_bf16"}),
])
def test_cuda_gates_by_compute_capability(key, arch, supported):
    device = gpu(key)
    assert device.architecture == arch
    got = {m for m in ("fp32", "tf32", "amp_fp16", "amp_bf16") if precision_support(m, device).supported}
    assert got == supported


def test_v100_bf16_is_unsupported_with_a_reason_even_though_torch_would_emulate_it():
    support = precision_support("amp_bf16", gpu("V100"))
    assert not support.supported and support.emulated
    assert "compute capability >= 8.0" in support.reason and "7.0" in support.reason
    assert may_run(support, allow_emulated=True) and not may_run(support, allow_emulated=False)
    tf32 = precision_support("tf32", gpu("T4"))
    assert not tf32.supported and not may_run(tf32, allow_emulated=True)  # nothing to emulate


def cpu(flags, fp16_autocast=True):
    return probe_device("cpu", cuda=FakeCuda(), cpu_info=("EPYC", frozenset(flags)), cpu_fp16_autocast=fp16_autocast)


def test_cpu_gates():
    plain = cpu({"avx2"})
    # one rule for emulation (as for fp16, and bf16 below Ampere): not run unless allow_emulated
    assert not precision_support("amp_bf16", plain).supported and precision_support("amp_bf16", plain).emulated
    assert not precision_support("tf32", plain).supported
    assert not precision_support("amp_fp16", plain).supported and precision_support("amp_fp16", plain).emulated
    sapphire = cpu({"avx512_bf16", "amx_bf16", "amx_fp16", "amx_tile"})
    assert precision_support("amp_fp16", sapphire).supported
    assert not precision_support("amp_bf16", sapphire).emulated
    # a real Sapphire Rapids: AVX512-FP16 without AMX-FP16 has no fast fp16 conv backward (38x slower)
    spr = cpu({"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_tile"})
    assert precision_support("amp_bf16", spr).supported
    fp16 = precision_support("amp_fp16", spr)
    assert not fp16.supported and fp16.emulated and "AMX-FP16" in fp16.reason
    no_fp16_autocast = cpu({"amx_fp16"}, fp16_autocast=False)
    assert "does not support float16" in precision_support("amp_fp16", no_fp16_autocast).reason


def test_probe_resolution():
    assert probe_device("auto", cuda=FakeCuda(*GPUS["H200"]), cpu_info=("x", frozenset())).type == "cuda"
    assert probe_device("auto", cuda=FakeCuda(), cpu_info=("x", frozenset()), cpu_fp16_autocast=False).type == "cpu"
    with pytest.raises(DeviceUnavailable, match="no CUDA device is available"):
        probe_device("cuda", cuda=FakeCuda(), cpu_info=("x", frozenset()))
    with pytest.raises(DeviceUnavailable, match="only 1 CUDA device"):
        probe_device("cuda:3", cuda=FakeCuda(*GPUS["A100"]), cpu_info=("x", frozenset()))
    with pytest.raises(DeviceUnavailable, match="expected auto, cpu, cuda"):
        probe_device("tpu", cuda=FakeCuda(), cpu_info=("x", frozenset()))


def test_device_info_round_trips_through_json():
    device = gpu("H200")
    assert DeviceInfo.from_json(device.to_json()) == device
    assert device.label == "nvidia-h200" and device.torch_device == "cuda:0"


def test_read_cpu_info(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu avx512_bf16 amx_tile\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n")
    assert read_cpu_info(str(info)) == ("AMD EPYC 9R14", frozenset({"fpu", "avx512_bf16", "amx_tile"}))


def test_a_kept_cpu_probe_is_reused_until_what_it_depends_on_changes(monkeypatch, tmp_path):
    """AMP_BENCH_PROBE_CACHE: the second probe starts no worker; another ONEDNN_MAX_CPU_ISA, another
    request, a GPU device node appearing or amp_bench's code changing probes afresh; a GPU's probe is
    never kept."""
    import os

    from amp_bench.launchers.process import WorkerOutcome
    from amp_bench.studies import probe_cache, session
    started = []
    found = {"type": "cpu", "name": "Xeon"}

    def probe_worker(args, result_path, log_path, timeout_s, server=None):
        started.append(args[1])
        return WorkerOutcome({"device": dict(found), "versions": {"torch": "2.14.1"}}, 0, False, None, 0.1, log_path)
    monkeypatch.setattr(session, "launch", probe_worker)
    monkeypatch.setattr(session, "software_record", lambda: {"git_commit": "abc"})
    monkeypatch.setenv("AMP_BENCH_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    first = session.probe("cpu")
    again = session.probe("cpu")
    assert len(started) == 1 and again == first and again["software"] == {"git_commit": "abc"}
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    session.probe("cpu")
    assert len(started) == 2  # the bf16 instructions hidden: another CPU as far as torch knows
    session.probe("auto")
    assert len(started) == 3
    session.probe("auto")
    assert len(started) == 3
    monkeypatch.setattr(probe_cache, "DEV", tmp_path / "dev")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()  # a GPU's driver loaded within the boot: `auto` looks again
    kept = set((tmp_path / "cache").iterdir())
    session.probe("auto")
    assert len(started) == 4
    # and keeps looking: a CPU answer while a GPU node exists (a transient CUDA failure) is never kept
    session.probe("auto")
    assert len(started) == 5 and set((tmp_path / "cache").iterdir()) == kept
    session.probe("cpu")
    session.probe("cpu")
    assert len(started) == 6  # asking for the CPU is still served from the cache (its key has the nodes)
    code = next(iter(sorted((tmp_path / "cache").iterdir())))
    monkeypatch.setattr(probe_cache, "_stamp", lambda path: [str(path), "changed"])  # amp_bench or torch changed
    session.probe("cpu")
    assert len(started) == 7 and code.exists()
    monkeypatch.undo()
    monkeypatch.setattr(session, "launch", probe_worker)
    monkeypatch.setattr(session, "software_record", lambda: {})
    monkeypatch.setenv("AMP_BENCH_PROBE_CACHE", str(tmp_path / "gpu"))
    found.update(type="cuda", name="NVIDIA H200")
    session.probe("cuda")
    session.probe("cuda")
    assert started[-2:] == ["cuda", "cuda"] and not (tmp_path / "gpu").exists()  # GPUs always probe afresh
    monkeypatch.delenv("AMP_BENCH_PROBE_CACHE")
    before = len(started)
    session.probe("cpu")
    session.probe("cpu")
    assert len(started) == before + 2  # unset: every run probes
    assert os.environ.get("AMP_BENCH_PROBE_CACHE") is None
