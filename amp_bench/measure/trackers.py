"""What is measured over a case's window beside its step times: one small tracker per concern, behind one
protocol (in the spirit of optimum-benchmark's trackers, with no torch import at module top and no branch on
the device inside a tracker: the device's differences are the DeviceOps seam's).

    start()              as the window opens (after warmup and the settle step)
    halt()               after the last step is launched, before the window's closing synchronize
    stop(steps) -> dict  as it closes: this tracker's columns; what it warns of in `warnings`, beside them
    reads                the trackers whose columns it builds on (contention reads NVML's clock events): they
                         stop before it (run_window checks the order)

Under DDP each rank's trackers give its own columns and measure.ddp.aggregate combines the ranks' records
(the most memory of any rank, the slowest rank's steps), by column.
"""
from __future__ import annotations

from dataclasses import dataclass

from amp_bench.measure.window import WindowTimes


class Tracker:
    reads: tuple[Tracker, ...] = ()
    warnings: tuple[str, ...] = ()

    def start(self) -> None:
        pass

    def halt(self) -> None:
        pass

    def stop(self, steps: int) -> dict:
        return {}


class MemoryTracker(Tracker):
    """The device's peak memory over the window (the CUDA allocator's, reset as it opens; nothing more on a
    CPU, whose peak RSS the process's high-water mark gives), that high-water mark, and the host memory the
    process faulted in per measured step (a steady step touches no new pages; one that faults pays for it)."""

    def __init__(self, ops):
        self.ops = ops
        self._faulted_at_start = 0

    def start(self) -> None:
        from amp_bench.measure.procfs import faulted_bytes
        self.ops.reset_peak_memory()
        self._faulted_at_start = faulted_bytes()

    def stop(self, steps: int) -> dict:
        from amp_bench.measure.procfs import faulted_bytes, read_status_bytes
        faulted = (faulted_bytes() - self._faulted_at_start) // steps if steps else None
        # the process's peak RSS so far: the phase probe after the window resets the kernel's high-water mark
        return {**self.ops.peak_memory_columns(), "rss_hwm_bytes": read_status_bytes("VmHWM:"),
                "window_faulted_bytes_per_step": faulted}


class NvmlTracker(Tracker):
    """NVML sampled through the window (memory, energy, clocks, clock events), from a reader the device's
    telemetry opened; halted before the closing synchronize, whose idle GPU it must not see."""

    def __init__(self, reader, baseline, interval_ms: float, batch_size: int):
        from amp_bench.platform.nvml import NvmlSampler
        self.sampler = NvmlSampler(reader, interval_s=interval_ms / 1e3)
        self.baseline, self.batch_size = baseline, batch_size
        self.columns: dict = {}  # what stop() returned, for a tracker that reads it

    def start(self) -> None:
        self.sampler.start()

    def halt(self) -> None:
        self.sampler.halt()

    def stop(self, steps: int) -> dict:
        self.columns = self.sampler.stop(self.baseline, steps, steps * self.batch_size)
        return self.columns


class ContentionTracker(Tracker):
    """Did the case get its machine: the host at the window's edges (telemetry.contention.WindowWatch,
    widened to warmup + window for an eager case whose window is too short), and, with a device meter,
    other processes on the device and clocks held down (the NVML tracker's clock events)."""

    def __init__(self, watch, nvml: NvmlTracker | None = None):
        self.watch, self.nvml = watch, nvml
        self.reads = (nvml,) if nvml is not None else ()

    def start(self) -> None:
        self.watch.start()

    def stop(self, steps: int) -> dict:
        from amp_bench.measure.telemetry.contention import gpu_contention, merge
        found = self.watch.stop()
        if self.nvml is not None:  # a device meter also sees the other processes on the device
            others = self.nvml.sampler.reader.other_processes()
            found = merge(found, gpu_contention(others, self.nvml.columns.get("clock_event_reasons")))
        return found


class CompileTracker(Tracker):
    """A compiled case's recompiles inside the window (dynamo's counters at its edges), with the warning
    that those steps include compile time."""

    def __init__(self, record: dict):
        self.record = record  # holds the snapshot compiling.warm_up took

    def stop(self, steps: int) -> dict:
        from amp_bench.measure import compiling
        found, warning = compiling.window_columns(self.record, compiling.CompileWatch().snapshot())
        self.warnings = (warning,) if warning else ()
        return found


@dataclass
class WindowReading:
    """A window's step times (window.WindowTimes) and what its trackers said: their columns and warnings."""
    times: WindowTimes
    columns: dict
    warnings: list[str]


def run_window(trackers: list[Tracker], measure) -> WindowReading:
    """`measure(halt)` times the window (window.measure_window, given the trackers' halt as its
    before_end); the trackers start just before it and stop after it, in order, each after those it reads."""
    unordered = [t for i, t in enumerate(trackers) for r in t.reads if r not in trackers[:i]]
    assert not unordered, f"a tracker stops before one it reads: {unordered}"
    for tracker in trackers:
        tracker.start()
    times = measure(lambda: [t.halt() for t in trackers])
    columns: dict = {}
    for tracker in trackers:
        columns.update(tracker.stop(len(times.per_step_ms)))
    return WindowReading(times, columns, [w for t in trackers for w in t.warnings])
