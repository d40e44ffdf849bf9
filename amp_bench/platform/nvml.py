"""NVML telemetry beside the measured steps: device memory, energy, power, clocks, temperature,
utilisation and clock-event (throttle) reasons, summarised into result columns.

The NVML module is a seam: `pynvml` (from nvidia-ml-py) in production, a fake that replays scripted
readings in tests. Every call the GPU or driver does not support degrades to an empty value with
the reason recorded; no NVML at all leaves every column empty and the run goes on.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable

from amp_bench.stats import energy_rates

ENERGY_WRAP = 2**64  # nvmlDeviceGetTotalEnergyConsumption is an unsigned 64-bit millijoule counter

# Clock-event reason bits (nvml.h, nvmlClocksEventReason*; the same bits as the older ThrottleReason*)
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}


def decode_clock_events(mask: int) -> list[str]:
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([f"unknown_0x{unknown:x}"] if unknown else [])


def load_nvml():
    """The pynvml module, initialised; raises RuntimeError with a one-line reason when unavailable."""
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("nvidia-ml-py is not installed (no `import pynvml`)") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise RuntimeError(f"NVML unavailable: {exc}") from None
    return pynvml


def device_handle(nvml, uuid: str | None, index: int, pci_bus_id: str | None = None,
                  visible_devices: str | None = None) -> tuple[object, str]:
    """(NVML handle of the CUDA device, note). By UUID (whole GPU or MIG instance), then by PCI bus id;
    NVML ignores CUDA_VISIBLE_DEVICES and CUDA's device order, so the index is used only when no
    device remapping is in effect, and said so."""
    if uuid:
        bare = uuid.split("-", 1)[1] if uuid.startswith(("GPU-", "MIG-")) else uuid
        for text in (f"GPU-{bare}", f"MIG-{bare}"):
            with contextlib.suppress(Exception):  # not this form: the next, then the bus id
                return nvml.nvmlDeviceGetHandleByUUID(text), ""
    if pci_bus_id:
        with contextlib.suppress(Exception):
            return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id), ""
    if visible_devices:
        raise RuntimeError(f"cannot match CUDA device {index} to an NVML device (CUDA_VISIBLE_DEVICES="
                           f"{visible_devices}; no UUID or PCI match): NVML columns left empty")
    return nvml.nvmlDeviceGetHandleByIndex(index), "NVML device chosen by index (no UUID or PCI match)"


def cuda_identity(index: int) -> tuple[str, int, str | None, str | None]:
    """(uuid, index, PCI bus id, CUDA_VISIBLE_DEVICES) of a CUDA device, for device_handle."""
    import torch
    props = torch.cuda.get_device_properties(index)
    uuid = str(getattr(props, "uuid", "") or "")
    bus = getattr(props, "pci_bus_id", None)
    pci = (f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
           if bus is not None else None)
    return uuid, index, pci, os.environ.get("CUDA_VISIBLE_DEVICES")


class NvmlReader:
    """One NVML device's readings; each unsupported call is remembered (with why) and not retried."""

    def __init__(self, nvml, handle, note: str = ""):
        self.nvml = nvml
        self.handle = handle
        self.unsupported: dict[str, str] = {"device": note} if note else {}

    def read(self, name: str, call: Callable):
        if name in self.unsupported:
            return None
        try:
            return call()
        except Exception as exc:  # pynvml raises NVMLError subclasses; a fake may raise anything
            self.unsupported[name] = f"{type(exc).__name__}: {exc}"
            return None

    def memory_used(self) -> int | None:
        info = self.read("memory", lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle))
        return None if info is None else int(info.used)

    def memory_v2(self) -> tuple[int, int] | None:
        """(used, reserved) from the v2 call, where the driver has it."""
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if version is None:
            self.unsupported.setdefault("memory_v2", "this nvidia-ml-py has no nvmlMemory_v2")
            return None
        info = self.read("memory_v2", lambda: self.nvml.nvmlDeviceGetMemoryInfo(self.handle, version=version))
        return None if info is None else (int(info.used), int(info.reserved))

    def energy_mj(self) -> int | None:
        return self.read("energy", lambda: int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)))

    def power_limit_w(self) -> float | None:
        mw = self.read("power_limit", lambda: self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle))
        return None if mw is None else mw / 1000

    def clocks(self) -> tuple[int | None, int | None]:
        sm = self.read("sm_clock", lambda: self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))
        mem = self.read("mem_clock", lambda: self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_MEM))
        return sm, mem

    def temperature(self) -> int | None:
        return self.read("temperature",
                         lambda: self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU))

    def utilization(self) -> int | None:
        rates = self.read("utilization", lambda: self.nvml.nvmlDeviceGetUtilizationRates(self.handle))
        return None if rates is None else int(rates.gpu)

    def clock_events(self) -> int | None:
        """The newer clocks-event call, falling back to the throttle-reasons call on older drivers."""
        if "clock_events" not in self.unsupported:
            value = self.read("clock_events", lambda: self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle))
            if value is not None:
                return int(value)
        value = self.read("throttle_reasons", lambda: self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))
        return None if value is None else int(value)

    def notes(self) -> dict[str, str]:
        """Why values are empty; a newer call whose older fallback answered is not worth a note."""
        notes = dict(self.unsupported)
        if "clock_events" in notes and "throttle_reasons" not in notes:
            del notes["clock_events"]
        return notes

    def process_memory(self, pid: int) -> int | None:
        """This process's device memory, when NVML can see it (inside a container it often cannot:
        NVML reports host PIDs)."""
        processes = self.read("process_memory", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        if processes is None:
            return None
        return next((int(process.usedGpuMemory) for process in processes
                     if int(process.pid) == pid and process.usedGpuMemory is not None), None)

    def other_processes(self) -> list[int] | None:
        """PIDs of the other compute processes on the device; None when NVML can't list them. Inside
        a PID namespace NVML lists host PIDs and ours is not recognisable: one entry is then taken to
        be this worker and the rest are others."""
        processes = self.read("process_memory", lambda: self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
        if processes is None:
            return None
        pids = [int(p.pid) for p in processes]
        if os.getpid() in pids:
            return [p for p in pids if p != os.getpid()]
        return pids[1:]


class NvmlSampler:
    """Samples a device beside the measured steps: memory every `interval_s` (default 10 ms),
    clocks/power/temperature/utilisation every `slow_interval_s`, per-process memory every
    `process_interval_s` (that call is slow and takes a driver lock). Energy is read at the window's
    edges and differenced."""

    def __init__(self, reader: NvmlReader, interval_s: float = 0.01, slow_interval_s: float = 0.1,
                 process_interval_s: float = 1.0, pid: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.reader = reader
        self.interval_s, self.slow_interval_s, self.process_interval_s = interval_s, slow_interval_s, process_interval_s
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self.used: list[int] = []
        self.used_v2: list[int] = []
        self.reserved_v2: list[int] = []
        self.sm_clock: list[int] = []
        self.mem_clock: list[int] = []
        self.temperature: list[int] = []
        self.utilization: list[int] = []
        self.process_used: list[int] = []
        self.process_seen = False
        self.clock_event_mask = 0
        self.clock_event_read = False
        self._energy_start: int | None = None
        self._next_slow = self._next_process = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- driven directly by tests, by the thread in production
    def begin(self) -> None:
        self._energy_start = self.reader.energy_mj()
        self._window_start = self.clock()
        self.sample(edge=True)

    def sample(self, edge: bool = False) -> None:
        """One reading. At the window's edges (`edge`: before the first step is launched and after the
        last has synchronised) the GPU idles, so only memory is read there: clocks, utilisation and
        clock-event reasons (gpu_idle) come from in-window samples alone."""
        now = self.clock()
        used = self.reader.memory_used()
        if used is not None:
            self.used.append(used)
        v2 = self.reader.memory_v2()
        if v2 is not None:
            self.used_v2.append(v2[0])
            self.reserved_v2.append(v2[1])
        if edge:
            return
        if now >= self._next_slow:
            self._next_slow = now + self.slow_interval_s
            sm, mem = self.reader.clocks()
            for values, value in ((self.sm_clock, sm), (self.mem_clock, mem),
                                  (self.temperature, self.reader.temperature()),
                                  (self.utilization, self.reader.utilization())):
                if value is not None:
                    values.append(value)
            mask = self.reader.clock_events()
            if mask is not None:
                self.clock_event_read = True
                self.clock_event_mask |= mask
        if now >= self._next_process:
            self._next_process = now + self.process_interval_s
            process = self.reader.process_memory(self.pid)
            if process is not None:
                self.process_seen = True
                self.process_used.append(process)

    def end(self, baseline_used: int | None, steps: int, samples: int) -> dict:
        self.sample(edge=True)
        return self.summary(baseline_used, self.reader.energy_mj(), self.clock() - self._window_start, steps, samples)

    # -- the thread
    def start(self) -> None:
        self.begin()
        self._thread = threading.Thread(target=self._run, name="amp_bench-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def halt(self) -> None:
        """Stop sampling (the thread ends) without closing the window: called before the window's
        final synchronisation, so no sample is taken while the drained GPU idles (gpu_idle)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def stop(self, baseline_used: int | None, steps: int, samples: int) -> dict:
        self.halt()
        return self.end(baseline_used, steps, samples)

    def summary(self, baseline_used: int | None, energy_end: int | None, window_s: float, steps: int,
                samples: int) -> dict:
        peak = max(self.used, default=None)
        known = peak is not None and baseline_used is not None
        out: dict = {"nvml_mem_used_baseline_bytes": baseline_used, "nvml_mem_used_peak_bytes": peak,
                     "nvml_mem_used_delta_bytes": peak - baseline_used if known else None,
                     "nvml_mem_v2_used_peak_bytes": max(self.used_v2, default=None),
                     "nvml_mem_v2_reserved_bytes": max(self.reserved_v2, default=None),
                     "nvml_process_mem_peak_bytes": max(self.process_used, default=None),
                     "nvml_samples": len(self.used)}
        energy_j = None
        if self._energy_start is not None and energy_end is not None:
            energy_j = ((energy_end - self._energy_start) % ENERGY_WRAP) / 1000
            if energy_j == 0:  # the counter did not tick inside the window: unknown, not zero
                energy_j = None
                self.reader.unsupported.setdefault("energy", "the energy counter did not advance during the window")
        out["energy_j"] = energy_j
        out["energy_j_per_step"] = energy_j / steps if energy_j is not None and steps else None
        out.update(energy_rates(energy_j, samples))
        out["power_avg_w"] = energy_j / window_s if energy_j is not None and window_s > 0 else None
        out["power_limit_w"] = self.reader.power_limit_w()
        for name, values in (("sm_clock_mhz", self.sm_clock), ("mem_clock_mhz", self.mem_clock)):
            out[f"{name}_median"] = statistics.median(values) if values else None
            out[f"{name}_min"] = min(values, default=None)
        out["temperature_c_max"] = max(self.temperature, default=None)
        out["gpu_util_pct_median"] = statistics.median(self.utilization) if self.utilization else None
        out["clock_event_reasons"] = ("|".join(decode_clock_events(self.clock_event_mask)) or "none") \
            if self.clock_event_read else None
        notes = self.reader.notes()
        if not self.clock_event_read and "clock_events" not in notes and "throttle_reasons" not in notes:
            notes["clock_events"] = "no reading inside the window (shorter than the slow sampling interval)"
        if not self.process_seen and "process_memory" not in notes:
            notes["process_memory"] = ("this process is not in NVML's process list (inside a container NVML "
                                       "reports host PIDs): no per-process figure")
        if energy_j is not None and window_s < 1.0:
            notes["energy_window"] = (f"the window was {window_s:.2f} s; the energy counter updates every "
                                      "20-100 ms, so the figure is coarse")
        out["nvml_notes"] = "; ".join(f"{k}: {v}" for k, v in notes.items())
        return out


NVML_COLUMNS = [
    "nvml_mem_used_baseline_bytes", "nvml_mem_used_peak_bytes", "nvml_mem_used_delta_bytes",
    "nvml_mem_v2_used_peak_bytes", "nvml_mem_v2_reserved_bytes", "nvml_process_mem_peak_bytes", "nvml_samples",
    "energy_j", "energy_j_per_step", "energy_j_per_sample", "samples_per_joule", "power_avg_w", "power_limit_w",
    "sm_clock_mhz_median", "sm_clock_mhz_min", "mem_clock_mhz_median", "mem_clock_mhz_min", "temperature_c_max",
    "gpu_util_pct_median", "clock_event_reasons", "nvml_notes",
]
