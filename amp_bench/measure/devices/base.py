"""What a device must provide to be measured: the seam methods run_case, the compiled warmup, DDP
and the pytest-benchmark fixture call instead of branching on the device type."""
from __future__ import annotations

from abc import ABC, abstractmethod


class DeviceOps(ABC):
    """One device as run_case uses it. `torch_device` is what tensors go to (a torch.device, or in
    tests a string); a subclass sets `type` (torch's device type) and `dist_backend` (DDP's
    default collective backend on it)."""

    type: str = ""
    dist_backend: str = "gloo"

    def __init__(self, torch_device):
        self.torch_device = torch_device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.torch_device!r})"

    # ------------------------------------------------------------------ place and order

    def for_rank(self, rank, device) -> DeviceOps:
        """This process's device under DDP (`rank`: ddp.Rank, `device`: the DeviceInfo asked for)."""
        return self

    def check_ranks(self, device, local_world_size: int) -> str | None:
        """Why `local_world_size` ranks from `device` can't run on this node, or None."""
        return None

    def ddp_kwargs(self) -> dict:
        """DistributedDataParallel's device arguments."""
        return {}

    def make_current(self) -> None:  # noqa: B027 - a hook with nothing to do by default, not an abstract one
        """Make the device this process's current one (before any tensor goes to it)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until the device has finished the work queued on it."""

    def fp32_math_env(self):
        """The environment whose overrides can change the FP32 math here (check_fp32_math), or None."""
        return None

    # ------------------------------------------------------------------ memory

    def tune_allocator(self, case) -> dict:
        """Set this process's host allocator for the case before anything is built; returns the columns
        that say how (none where the host allocator does not hold the measured tensors)."""
        return {}

    @abstractmethod
    def cap_memory(self, case) -> dict:
        """Cap this process's memory at case.memory_cap_bytes (running out is an ordinary OOM);
        returns the memory_cap_* columns."""

    @abstractmethod
    def reset_peak_memory(self) -> None:
        """Start the peak-memory counters afresh (as the window opens)."""

    @abstractmethod
    def peak_memory_columns(self) -> dict:
        """The device's peak-memory columns since reset_peak_memory (none where it keeps no count)."""

    # oneDNN runs this device's kernels, so explain reads its verbose log on one more step (CPUs)
    onednn_kernels = False
    # its GEMMs slow down on dimensions that are not multiples of 8 (Tensor Core kernels), so advice's shape probe
    # times the step's misaligned linear layers padded (measure/telemetry/shape_probe.py)
    padded_gemms_differ = False
    # fp8: float8 matmuls may be emulated by torchao where torch's _scaled_mm does not run (CPUs); a GPU
    # the gate passed runs them natively, and emulating there would hide a fault
    fp8_may_emulate = False

    def profiler_activities(self) -> tuple[list, object]:
        """(torch.profiler activities, the sync that ends a step's work) for explain's profiled steps."""
        from torch.profiler import ProfilerActivity
        return [ProfilerActivity.CPU], lambda: None

    def host_threads(self, num_threads: int) -> int:
        """The host cores the measured step needs, the share contention is judged against (the CPU's
        step runs on all of torch's `num_threads`)."""
        return num_threads

    @abstractmethod
    def phase_probe(self):
        """A per-phase peak-memory probe (telemetry.phase_memory), or None where none works here."""

    # ------------------------------------------------------------------ telemetry and the window

    def open_telemetry(self, device, rank=None) -> tuple:
        """(reader, idle used-memory baseline, columns) of a device-level meter (NVML), or (None, None, {}).
        Under DDP every rank calls it after the process group exists."""
        return None, None, {}

    def settle(self, step, inputs, target, reader, steps_taken: int = 0) -> dict:
        """Between warmup (`steps_taken` steps) and the window, what the device needs so that the window's
        steps and memory readings are the step's own (the FP32 math re-check is every device's, in case.py)."""
        return {}

    @abstractmethod
    def step_timer(self, max_steps: int):
        """The window's step timer (window.CpuStepTimer or its like), made as the window opens."""

    def peak_rates(self, device_name: str, precision: str) -> tuple:
        """(dense peak TFLOP/s for the mode, its source, the bf16 dense peak) for MFU."""
        return None, f"no peak-rate table for {self.type} devices (give peak_tflops to get an MFU)", None
