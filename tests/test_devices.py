"""The per-device seam (amp_bench/measure/devices): the CPU object on this CPU, and the CUDA object's
logic through a fake torch.cuda that replays the readings of a real GPU (an H100's 80 GiB, allocator
counters and CUDA event times), so both run without a GPU."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from amp_bench.measure import devices
from amp_bench.measure.devices import DeviceOps, for_device
from amp_bench.measure.devices.cpu import CpuOps
from amp_bench.measure.devices.cuda import CudaOps
from amp_bench.measure.window import CpuStepTimer, CudaStepTimer, StopRule, measure_window
from amp_bench.platform.device import DeviceInfo
from conftest import ROOT

GiB = 2**30
MiB = 2**20
H100_TOTAL = 85_045_231_616  # torch.cuda.get_device_properties(0).total_memory on an H100 80GB HBM3


class FakeEvent:
    """torch.cuda.Event(enable_timing=True): elapsed_time(end) in ms, from a GPU-side clock."""

    def __init__(self, gpu):
        self.gpu, self.at = gpu, None

    def record(self):
        self.at = self.gpu.now_ms

    def elapsed_time(self, end):
        return end.at - self.at


class FakeCuda:
    """torch.cuda as the seam uses it: a caching allocator that allocates and frees as steps run
    (allocated <= reserved; reset_peak_memory_stats brings the peaks down to the current values),
    a GPU clock that each `work(ms)` advances, and a log of the calls."""

    def __init__(self, devices_visible=8):
        self.calls, self.devices_visible = [], devices_visible
        self.now_ms, self.allocated, self.reserved = 0.0, 0, 0
        self.peak_allocated, self.peak_reserved = 0, 0
        self.fraction = None
        self.alloc_retries = 0  # accumulated since the process began: reset_peak_memory_stats keeps it

    def work(self, ms, alloc=0, free=0, retries=0):
        self.now_ms += ms
        self.alloc_retries += retries
        self.allocated += alloc
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.allocated -= free

    def Event(self, enable_timing=False):  # torch's name
        assert enable_timing
        return FakeEvent(self)

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def empty_cache(self):
        self.calls.append("empty_cache")
        self.reserved = self.allocated

    def set_device(self, device):
        self.calls.append(f"set_device {device}")

    def device_count(self):
        return self.devices_visible

    def get_device_properties(self, device):
        return SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=H100_TOTAL)

    def set_per_process_memory_fraction(self, fraction, device=None):
        self.fraction = fraction

    def memory_allocated(self, device=None):
        return self.allocated

    def max_memory_allocated(self, device=None):
        return self.peak_allocated

    def max_memory_reserved(self, device=None):
        return self.peak_reserved

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset_peak_memory_stats")
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def memory_stats(self, device=None):
        return {"num_alloc_retries": self.alloc_retries, "allocated_bytes.all.current": self.allocated}


def test_for_device_picks_the_object_by_the_device_type():
    import torch
    assert type(for_device(torch.device("cpu"))) is CpuOps
    ops = for_device(torch.device("cuda", 1))
    assert type(ops) is CudaOps and ops.index == 1 and ops.type == "cuda"
    assert for_device("cuda:3").index == 3 and for_device("cuda").index == 0
    assert devices.kind_of(DeviceInfo("cuda", "NVIDIA H200", index=0)) == "cuda"
    assert isinstance(for_device("cpu"), DeviceOps)


def test_an_unknown_backend_says_which_file_to_add():
    with pytest.raises(ValueError, match=r"no device seam for 'xpu'.*devices/xpu.py"):
        for_device("xpu:0")


def test_a_backend_must_name_every_seam_method():
    class Half(DeviceOps):
        type = "half"

        def synchronize(self):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Half("half")


def test_the_seam_imports_no_torch():
    code = ("import sys, json, amp_bench.measure.devices as d, amp_bench.measure.devices.cpu, "
            "amp_bench.measure.devices.cuda; d.for_device('cuda:0'); d.for_device('cpu'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    assert json.loads(out.stdout) == []


# --------------------------------------------------------------------------- the CPU

def test_the_cpu_times_with_the_host_clock_and_keeps_no_device_counters():
    ops = CpuOps("cpu")
    assert ops.dist_backend == "gloo" and ops.fp32_math_env() is None
    ops.make_current()
    ops.synchronize()
    ops.reset_peak_memory()
    assert ops.peak_memory_columns() == {}
    assert isinstance(ops.step_timer(5), CpuStepTimer)
    assert ops.open_telemetry(DeviceInfo("cpu", "cpu")) == (None, None, {})
    record = ops.settle(None, None, None, None)  # no allocator tuned: nothing to settle, no extra step
    assert record == {"settle_steps": 0}
    assert ops.for_rank(SimpleNamespace(local_rank=1), DeviceInfo("cpu", "cpu")) is ops
    assert ops.check_ranks(DeviceInfo("cpu", "cpu"), 4) is None and ops.ddp_kwargs() == {}
    assert ops.peak_rates("AMD EPYC", "amp_bf16") == (
        None, "no peak-rate table for CPUs (give peak_tflops to get an MFU)", None)


def test_the_cpu_phase_probe_only_where_the_kernel_offers_it(monkeypatch):
    from amp_bench.measure.telemetry import phase_memory
    monkeypatch.setattr(phase_memory.CpuPhaseProbe, "available", lambda self: True)
    assert isinstance(CpuOps("cpu").phase_probe(), phase_memory.CpuPhaseProbe)
    monkeypatch.setattr(phase_memory.CpuPhaseProbe, "available", lambda self: False)
    assert CpuOps("cpu").phase_probe() is None


def test_the_cpu_caps_the_address_space_above_the_rehearsed_process(monkeypatch):
    import resource

    from amp_bench.measure import procfs
    from amp_bench.measure.devices import cpu
    steps, limits = [], []
    monkeypatch.setattr(cpu, "_predictable_malloc", lambda: steps.append("malloc"))
    monkeypatch.setattr(cpu, "_rehearse", lambda case, kind, device: steps.append(f"rehearse {kind} {device}"))
    monkeypatch.setattr(procfs, "read_status_bytes", lambda key: 3 * GiB if key == "VmSize:" else None)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    monkeypatch.setattr(resource, "setrlimit", lambda what, pair: limits.append((what, pair)))
    columns = CpuOps("cpu").cap_memory(SimpleNamespace(memory_cap_bytes=2 * GiB))
    assert steps == ["malloc", "rehearse cpu cpu"]
    assert limits == [(resource.RLIMIT_AS, (5 * GiB, resource.RLIM_INFINITY))]
    assert columns == {"memory_cap_bytes": 2 * GiB, "memory_cap_kind": "address space above the bare torch process",
                       "memory_cap_baseline_bytes": 3 * GiB}


class FakeLibc:
    """glibc's mallopt as keep_freed_memory calls it: every (param, value) kept, `accept` answered."""

    def __init__(self, accept=1):
        self.calls, self.accept = [], accept

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.accept


def test_cpu_keeps_freed_memory_unless_told_or_the_allocator_is_not_glibcs(monkeypatch):
    from amp_bench.measure.devices import cpu
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    libc = FakeLibc()
    case = SimpleNamespace(cpu_allocator="keep", memory_cap_bytes=None)
    assert cpu.keep_freed_memory(case, lambda: libc) == "keep"
    assert libc.calls == [(cpu.M_MMAP_THRESHOLD, 32 << 20), (cpu.M_MMAP_MAX, 0), (cpu.M_TRIM_THRESHOLD, 2**31 - 1)]
    untouched = FakeLibc()
    assert cpu.keep_freed_memory(SimpleNamespace(cpu_allocator="system"), lambda: untouched) == "system"
    assert cpu.keep_freed_memory(case, lambda: None) == "system (not glibc)"
    assert cpu.keep_freed_memory(case, lambda: FakeLibc(accept=0)) == "system (glibc refused mallopt)"
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert cpu.keep_freed_memory(case, lambda: untouched) == "system (LD_PRELOAD libjemalloc.so.2)"
    assert untouched.calls == []
    monkeypatch.setattr(cpu, "keep_freed_memory", lambda case: "keep")  # a capped case keeps cap_memory's malloc
    assert CpuOps("cpu").tune_allocator(SimpleNamespace(cpu_allocator="keep",
                                                        memory_cap_bytes=GiB))["cpu_allocator"].startswith("memory cap")
    assert CpuOps("cpu").tune_allocator(case) == {"cpu_allocator": "keep"}


PAGE_FAULTS_PER_ROUND = """
import ctypes, resource, sys
from types import SimpleNamespace
from amp_bench.measure.devices.cpu import keep_freed_memory
print(keep_freed_memory(SimpleNamespace(cpu_allocator=sys.argv[1])))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
SIZES = [8 << 20] * 8 + [48 << 20]  # a step's activations, one above glibc's 32 MiB mmap ceiling
for _ in range(4):  # written, then all freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for size in SIZES]
    for block, size in zip(blocks, SIZES):
        ctypes.memset(block, 1, size)
    for block in blocks:
        libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and minor-fault counts: Linux")
def test_kept_memory_is_written_again_without_page_faults():
    """Real glibc, no timing: 112 MiB of blocks (one of 48 MiB, above the 32 MiB mmap ceiling) freed and
    taken again fault in again under glibc's defaults (28672 pages a round) and not at all once the
    worker keeps freed memory."""
    faults = {}
    for setting in ("keep", "system"):
        out = subprocess.run([sys.executable, "-c", PAGE_FAULTS_PER_ROUND, setting], cwd=ROOT, check=True,
                             capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                                  if k != "LD_PRELOAD"}).stdout.split()
        assert out[0] == setting
        faults[setting] = [int(n) for n in out[1:]]
    pages = (112 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert all(n > pages // 2 for n in faults["system"]), faults  # every round pages its blocks in again
    assert faults["keep"][0] > pages // 2 and max(faults["keep"][1:]) < pages // 20, faults


def test_cpu_settles_until_two_steps_were_taken_only_where_the_case_keeps_freed_memory(monkeypatch):
    from amp_bench.measure.devices import cpu
    faulted = iter([10 * MiB, 130 * MiB])  # before and after the untimed step: it faulted in 120 MiB
    monkeypatch.setattr("amp_bench.measure.procfs.faulted_bytes", lambda: next(faulted))
    monkeypatch.setattr(cpu, "keep_freed_memory", lambda case: "system (not glibc)")  # what mallopt answered
    steps = []
    step = SimpleNamespace(untimed_step=lambda inputs, target: steps.append((inputs, target)))
    keep = SimpleNamespace(cpu_allocator="keep", memory_cap_bytes=None)
    ops = CpuOps("cpu")
    record = ops.tune_allocator(keep)
    record.update(ops.settle(step, "x", "y", None, steps_taken=1))  # one warmup step: the second still faults
    assert steps == [("x", "y")]
    # decided from the case (every DDP rank has it), not from what this node's libc did
    assert record == {"cpu_allocator": "system (not glibc)", "settle_steps": 1, "settle_faulted_bytes": 120 * MiB}
    record = ops.settle(step, "x", "y", None, steps_taken=2)  # two warmup steps already: the window opens
    assert record == {"settle_steps": 0} and len(steps) == 1
    for case in (SimpleNamespace(cpu_allocator="system", memory_cap_bytes=None),
                 SimpleNamespace(cpu_allocator="keep", memory_cap_bytes=GiB)):
        other = CpuOps("cpu")  # every step faults there: the window opens at once, as before
        other.tune_allocator(case)
        record = other.settle(step, "x", "y", None, steps_taken=0)
        assert record == {"settle_steps": 0} and len(steps) == 1
    assert cpu.settle_memory(lambda: None, 2, faulted=iter([0, 8192, 8192, 12288]).__next__) == {
        "settle_steps": 2, "settle_faulted_bytes": 4096}


FAULTED_BYTES_OF_A_BLOCK = """
from amp_bench.measure.procfs import faulted_bytes
before = faulted_bytes()
block = bytearray(32 << 20)  # calloc'd: the kernel's zero pages, faulted in as they are written
block[::4096] = b"\\1" * len(block[::4096])
first = faulted_bytes() - before
before = faulted_bytes()
block[::4096] = b"\\2" * len(block[::4096])  # written again: nothing new
print(first, faulted_bytes() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="minor-fault counts: Linux")
def test_faulted_bytes_counts_the_pages_a_process_touches_for_the_first_time():
    """In a process of its own: this one's heap may already hold freed pages to hand the block (a kept-
    memory case ran in it), and then nothing faults."""
    out = subprocess.run([sys.executable, "-c", FAULTED_BYTES_OF_A_BLOCK], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.split()
    first, again = int(out[0]), int(out[1])
    assert first >= 30 * MiB and again < 2 * MiB, out


def test_the_memory_tracker_reports_what_the_window_faulted_in_per_step(monkeypatch):
    from amp_bench.measure.trackers import MemoryTracker
    faulted = iter([100 * MiB, 106 * MiB])
    monkeypatch.setattr("amp_bench.measure.procfs.faulted_bytes", lambda: next(faulted))
    tracker = MemoryTracker(CpuOps("cpu"))
    tracker.start()
    columns = tracker.stop(3)
    assert columns["window_faulted_bytes_per_step"] == 2 * MiB
    assert columns["rss_hwm_bytes"] > 0


# --------------------------------------------------------------------------- CUDA, through a fake torch.cuda

def test_cuda_caps_the_allocator_at_its_fraction_of_the_device():
    fake = FakeCuda()
    columns = CudaOps("cuda:0", cuda=fake).cap_memory(SimpleNamespace(memory_cap_bytes=40 * GiB))
    assert fake.fraction == pytest.approx(40 * GiB / H100_TOTAL)
    assert columns == {"memory_cap_bytes": 40 * GiB, "memory_cap_kind": "cuda allocator fraction of the device"}
    CudaOps("cuda:0", cuda=fake).cap_memory(SimpleNamespace(memory_cap_bytes=200 * GiB))
    assert fake.fraction == 1.0  # never above the whole device


def test_cuda_times_the_window_with_events_and_reads_the_peaks_since_the_reset():
    fake = FakeCuda()
    ops = CudaOps("cuda:0", cuda=fake)
    fake.work(50.0, alloc=30 * GiB, free=0, retries=5)  # the model, optimizer state, warmup's high-water mark
    fake.work(5.0, alloc=20 * GiB, free=20 * GiB)  # (and cudnn.benchmark's search: 5 allocator retries)
    timer = ops.step_timer(4)
    assert isinstance(timer, CudaStepTimer)
    ops.reset_peak_memory()
    assert fake.calls[-2:] == ["synchronize", "reset_peak_memory_stats"]
    gpu_ms, retries = iter([12.5, 12.0, 12.25, 12.0]), iter([0, 1, 0, 1])

    def step():
        fake.work(next(gpu_ms), alloc=8 * GiB, free=8 * GiB, retries=next(retries))  # activations, freed

    per_step, _, reason = measure_window(step, timer, StopRule.fixed(4))
    assert per_step == [12.5, 12.0, 12.25, 12.0] and reason == "fixed steps"
    assert ops.peak_memory_columns() == {"peak_mem_allocated_bytes": 38 * GiB,  # not warmup's 50
                                         "peak_mem_reserved_bytes": 50 * GiB,  # reserved stays cached
                                         "cuda_num_alloc_retries": 2}  # the window's, not warmup's 5


def test_a_gpu_step_is_judged_for_contention_on_the_host_core_it_needs():
    """A 16-core GPU host with 3 cores busy elsewhere: torch's 16 CPU threads would have had 81% of
    their cores (contended), but a GPU step needs one host core and had all of it."""
    from amp_bench.measure.devices.cpu import CpuOps
    from amp_bench.measure.telemetry.contention import HostTimes, cpu_contention
    before, after = HostTimes(1000.0, 0.0, 10.0, 16), HostTimes(1000.0 + 10 * 4.0, 0.0, 10.0 + 10 * 1.0, 16)
    gpu = cpu_contention(before, after, 10.0, CudaOps("cuda:0", cuda=FakeCuda()).host_threads(16))
    assert gpu["contended"] is False and gpu["host_other_cpu_cores"] == pytest.approx(3.0)
    cpu = cpu_contention(before, after, 10.0, CpuOps("cpu").host_threads(16))
    assert cpu["contended"] is True and cpu["cpu_share_available"] == pytest.approx(13 / 16)


def test_cuda_settle_drops_the_cache_steps_once_then_resets_the_peaks():
    fake, steps = FakeCuda(), []
    fake.work(1.0, alloc=30 * GiB, free=20 * GiB)  # cudnn.benchmark's search: 30 GiB reserved, 10 in use
    step = SimpleNamespace(untimed_step=lambda inputs,
                           target: steps.append("untimed") or fake.work(1.0, 4 * GiB, 4 * GiB))
    reader = SimpleNamespace(memory_used=lambda: 16 * GiB)
    record = CudaOps("cuda:0", cuda=fake).settle(step, None, None, reader)
    assert fake.calls == ["synchronize", "empty_cache", "synchronize", "reset_peak_memory_stats"]
    assert steps == ["untimed"]
    assert fake.max_memory_reserved() == 14 * GiB  # the search's 30 GiB is gone from the peak
    assert record == {"settle_steps": 1, "nvml_mem_used_settled_bytes": 16 * GiB}


def test_cuda_phase_probe_reads_the_allocator_through_the_same_fake():
    from amp_bench.measure.telemetry.phase_memory import CudaPhaseProbe, phase_columns
    fake = FakeCuda()
    fake.work(0.0, alloc=10 * GiB)  # weights and optimizer state
    probe = CudaOps("cuda:0", cuda=fake).phase_probe()
    assert isinstance(probe, CudaPhaseProbe)
    probe.mark("forward")
    fake.work(1.0, alloc=6 * GiB)  # activations kept for backward
    probe.mark("backward")
    fake.work(1.0, alloc=2 * GiB, free=8 * GiB)  # gradients in, activations out
    probe.mark("optimizer")
    fake.work(1.0, alloc=1 * GiB, free=1 * GiB)
    probe.mark("end")
    assert phase_columns(probe) == {"peak_mem_forward_bytes": 16 * GiB, "peak_mem_backward_bytes": 18 * GiB,
                                    "peak_mem_optimizer_bytes": 11 * GiB, "phase_memory_source": "cuda_allocated"}


def test_cuda_under_ddp_takes_the_ranks_gpu_and_checks_there_are_enough():
    import torch
    fake = FakeCuda(devices_visible=2)
    ops = CudaOps(torch.device("cuda", 0), cuda=fake)
    mine = ops.for_rank(SimpleNamespace(local_rank=1), DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", index=0))
    assert mine.torch_device == torch.device("cuda", 1) and mine.cuda is fake
    assert mine.ddp_kwargs() == {"device_ids": [1], "output_device": 1}
    mine.make_current()
    assert fake.calls == ["set_device cuda:1"]
    assert ops.dist_backend == "nccl" and ops.fp32_math_env() is os.environ
    gpu = DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", index=1)
    assert ops.check_ranks(gpu, 1) is None
    assert ops.check_ranks(gpu, 2) == "nproc_per_node=2 from cuda:1 needs 3 GPUs on this node, 2 visible"


def test_cuda_peak_rates_come_from_the_datasheet_table():
    ops = CudaOps("cuda:0", cuda=FakeCuda())
    peak, source, bf16 = ops.peak_rates("NVIDIA H100 80GB HBM3", "amp_fp16")
    assert peak == 989.0 and bf16 == 989.0 and source.startswith("fp16 dense peak: NVIDIA H100 datasheet")
    peak, source, bf16 = ops.peak_rates("NVIDIA H100 80GB HBM3", "fp32")
    assert peak == 67.0 and source.startswith("fp32 dense peak:") and bf16 == 989.0
    peak, _, bf16 = ops.peak_rates("Some Future GPU", "amp_bf16")
    assert peak is None and bf16 is None
