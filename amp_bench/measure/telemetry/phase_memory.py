"""Where the memory goes: peak memory per phase of one training step (forward, backward, optimizer).

Run on one extra, instrumented step after the measured window, because every phase boundary syncs
the device. On CUDA the allocator's peak is reset at each boundary; on Linux CPUs the process's RSS
high-water mark is reset through /proc/self/clear_refs and read back from VmHWM.
"""
from __future__ import annotations

PHASES = ("forward", "backward", "optimizer")


class CudaPhaseProbe:
    source = "cuda_allocated"

    def __init__(self, device, cuda=None):
        if cuda is None:
            import torch
            cuda = torch.cuda
        self.cuda, self.device = cuda, device  # cuda: torch.cuda, or a test's fake
        self.peaks: dict[str, int] = {}
        self._current: str | None = None

    def mark(self, phase: str) -> None:
        self.cuda.synchronize(self.device)
        if self._current is not None:
            self.peaks[self._current] = int(self.cuda.max_memory_allocated(self.device))
        self.cuda.reset_peak_memory_stats(self.device)
        self._current = phase if phase in PHASES else None


class CpuPhaseProbe:
    source = "cpu_rss_hwm"

    def __init__(self, status_path: str = "/proc/self/status", clear_refs_path: str = "/proc/self/clear_refs"):
        self.status_path, self.clear_refs_path = status_path, clear_refs_path
        self.peaks: dict[str, int] = {}
        self._current: str | None = None

    def available(self) -> bool:
        try:
            self._reset()
            return self._hwm() is not None
        except OSError:
            return False

    def _hwm(self) -> int | None:
        with open(self.status_path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return None

    def _reset(self) -> None:
        with open(self.clear_refs_path, "w", encoding="ascii") as fh:
            fh.write("5")  # "5": reset the peak RSS to the current RSS (Linux >= 4.0)

    def mark(self, phase: str) -> None:
        if self._current is not None:
            self.peaks[self._current] = self._hwm()
        self._reset()
        self._current = phase if phase in PHASES else None


def phase_columns(probe) -> dict:
    out = {f"peak_mem_{phase}_bytes": probe.peaks.get(phase) for phase in PHASES}
    out["phase_memory_source"] = probe.source if probe.peaks else ""
    return out
