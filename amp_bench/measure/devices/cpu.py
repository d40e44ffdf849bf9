"""The CPU: the step is synchronous (the host clock times it), memory is the process's (RSS, an
address-space cap), and there is no device meter or peak-rate table."""
from __future__ import annotations

import contextlib
import os

from amp_bench.measure.devices.base import DeviceOps


def _rehearse(case, device_type: str, torch_device) -> None:
    """A training step on a tiny model, and the model's library imported: everything the real
    step loads lazily (modules, the thread pool) is in place before the cap is measured from."""
    import torch

    from amp_bench import modes
    from amp_bench.measure.step import TrainStep, build_optimizer
    from amp_bench.suite.model_refs import import_callable, kind_of
    model = torch.nn.Linear(64, 64).to(torch_device)
    step = TrainStep(model, torch.nn.functional.mse_loss, build_optimizer(model.parameters(), case.optimizer),
                     modes.get(case.precision), device_type)
    step(torch.ones(8, 64, device=torch_device), torch.ones(8, 64, device=torch_device))
    kind = kind_of(case.model.ref)
    if kind == "torchvision":
        import torchvision.models  # noqa: F401
    elif kind == "transformers":
        import transformers  # noqa: F401
    elif kind == "python":
        import_callable(case.model.ref, case.search_dirs)


def _predictable_malloc() -> None:
    """glibc: one arena and a fixed mmap threshold. Otherwise whether a thread reserves its own 64 MiB
    arena, and whether a large block comes from mmap or the heap, varies from run to run, and the
    address space a batch needs with it: the same batch would fit in one probe and not the next."""
    import ctypes
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the cap still holds, only less sharply
        libc = ctypes.CDLL(None)
        libc.mallopt(-8, 1)  # M_ARENA_MAX
        libc.mallopt(-3, 256 * 1024)  # M_MMAP_THRESHOLD: large blocks always mmap, returned on free


# glibc's ceiling for M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2): alone, blocks above it still come from
# mmap and go back on free; M_MMAP_MAX 0 takes every block from the heap (a thread's arena that cannot hold
# one retries in the main arena, which grows by brk, or by mmap as its own heap where brk cannot)
KEEP_MMAP_THRESHOLD = 32 << 20
KEEP_MMAP_MAX = 0
KEEP_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: the heap's free top is never handed back in practice
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def _glibc():
    """glibc's handle, or None where the C library is another one (musl, macOS)."""
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        return libc
    return None


def keep_freed_memory(case, libc_of=_glibc) -> str:
    """cpu_allocator: keep. glibc hands a large freed block back to the kernel (munmap, or a trimmed heap
    top), so the next step faults it in again, zeroed page by page; on a VM that reports free pages to
    its host each such page may also cost the host a fault. On the 2-core EPYC VM (2026-12-04) ResNet-50
    bs 8 faulted 5-90 thousand pages a step under glibc's defaults and none after its second step with
    freed memory kept; the median within-window CV of its main-job steps fell from 5-21% to 2-4% and
    its steps were ~9% faster, peak RSS unchanged. At bs 32 its activations pass 32 MiB: with the
    threshold alone those blocks were still unmapped on free, 100-600 thousand faults a step from the
    fifth on; with no mmap at all none from the third, steps 5.2-5.5 s against 5.6-5.8 s, peak RSS
    4.9-5.0 GB against 4.6-4.7 GB (freed blocks are reused, not returned). Keeping what was freed is
    what CUDA's caching allocator does on a GPU. Returns what the row records (the cpu_allocator column)."""
    if case.cpu_allocator == "system":
        return "system"
    preloaded = [lib for lib in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
                 if any(name in lib for name in PRELOADED_ALLOCATORS)]
    if preloaded:  # the user chose an allocator: measured as it is
        return f"system (LD_PRELOAD {os.path.basename(preloaded[0])})"
    libc = libc_of()
    if libc is None:
        return "system (not glibc)"
    if not all(libc.mallopt(param, value) for param, value in ((M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD),
                                                               (M_MMAP_MAX, KEEP_MMAP_MAX),
                                                               (M_TRIM_THRESHOLD, KEEP_TRIM_THRESHOLD))):
        return "system (glibc refused mallopt)"
    return "keep"


# The window opens after this many steps in all: the second step is the last whose memory still faults in
STEPS_BEFORE_WINDOW = 2


def settle_memory(run_step, steps: int, faulted=None) -> dict:
    """`steps` untimed steps (those warmup left of STEPS_BEFORE_WINDOW), the last one's faulted-in memory
    recorded. The second step of a worker still touches new pages (the optimizer state made in the first
    update moves where the next step's activations land); the steps after it touch next to none. On the
    2-core EPYC VM (2026-12-04) ResNet-50 bs 8's second step faulted in 60-270 MB and, as the first step
    of a lockstep window (warmup_steps: 1), ran 7-26% slower than the window's other steps (a median 1.16x
    for fp32, 1.26x for bf16 in one main job; 1.02-1.05x one worker at a time); with it out of the window
    the windows' step-time CV fell to 0.3-5% (one 10.7%). Settling on until a step faulted in under 1% of
    the RSS took 2.4 steps a worker and a third more time for little. Returns the row's settle columns."""
    from amp_bench.measure.procfs import faulted_bytes
    faulted = faulted or faulted_bytes
    new_bytes = None
    for _ in range(steps):
        before = faulted()
        run_step()
        new_bytes = faulted() - before
    return {"settle_steps": steps, **({"settle_faulted_bytes": new_bytes} if steps else {})}


class CpuOps(DeviceOps):
    type = "cpu"
    dist_backend = "gloo"
    onednn_kernels = True  # explain reads oneDNN's verbose log on one more step (measure/telemetry/profile.py)
    fp8_may_emulate = True  # torchao emulates float8 matmuls where torch's _scaled_mm does not run on the CPU

    def synchronize(self) -> None:
        pass  # CPU work is done when the call returns

    _case_keeps_memory = False  # the case asked for cpu_allocator: keep, uncapped (tune_allocator)

    def tune_allocator(self, case) -> dict:
        """A capped case keeps cap_memory's predictable malloc instead (its blocks go back on free)."""
        if case.memory_cap_bytes:
            return {"cpu_allocator": "memory cap (large blocks from mmap, returned on free)"}
        self._case_keeps_memory = case.cpu_allocator == "keep"
        return {"cpu_allocator": keep_freed_memory(case)}

    def settle(self, step, inputs, target, reader, steps_taken: int = 0) -> dict:
        """With freed memory kept, untimed steps until the worker has taken STEPS_BEFORE_WINDOW (none after
        a warmup of two or more). Decided from the case, never from what mallopt answered: DDP ranks on
        differently set-up nodes still take the same steps (each all-reduces). Under glibc's defaults
        (or a capped case's malloc) every step faults: those windows open at once, as they always did."""
        steps = max(0, STEPS_BEFORE_WINDOW - steps_taken) if self._case_keeps_memory else 0
        return settle_memory(lambda: step.untimed_step(inputs, target), steps)

    def cap_memory(self, case) -> dict:
        """An address-space limit (RLIMIT_AS) of the process as it stands after a rehearsal step, plus
        the cap, so the cap is what the model and its training may use on top of the bare runtime."""
        import resource

        from amp_bench.measure.procfs import read_status_bytes
        cap_bytes = case.memory_cap_bytes
        _predictable_malloc()
        _rehearse(case, self.type, self.torch_device)
        baseline = read_status_bytes("VmSize:") or 0
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = baseline + cap_bytes
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        return {"memory_cap_bytes": cap_bytes, "memory_cap_kind": "address space above the bare torch process",
                "memory_cap_baseline_bytes": baseline}

    def reset_peak_memory(self) -> None:
        pass  # the RSS high-water mark is the process's: run_case reads VmHWM, the phase probe resets it

    def peak_memory_columns(self) -> dict:
        return {}

    def phase_probe(self):
        """The RSS high-water mark through /proc (Linux >= 4.0), where the kernel offers it."""
        from amp_bench.measure.telemetry.phase_memory import CpuPhaseProbe
        probe = CpuPhaseProbe()
        return probe if probe.available() else None

    def step_timer(self, max_steps: int):
        from amp_bench.measure.window import CpuStepTimer
        return CpuStepTimer()

    def peak_rates(self, device_name: str, precision: str) -> tuple:
        return None, "no peak-rate table for CPUs (give peak_tflops to get an MFU)", None
