"""The NVML sampler and its summary, driven by a fake NVML that replays scripted readings."""
import threading
import time

import pytest
from fake_nvml import FakeNvml

from amp_bench.platform.nvml import ENERGY_WRAP, NvmlReader, NvmlSampler, decode_clock_events, device_handle, load_nvml

GIB = 2**30


class Clock:
    def __init__(self, step=0.01):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def run_window(fake, samples=10, pid=4242, steps=20, batch=64, clock_step=0.05):
    sampler = NvmlSampler(NvmlReader(fake, "h"), interval_s=0.01, slow_interval_s=0.0, process_interval_s=0.0,
                          pid=pid, clock=Clock(clock_step))
    sampler.begin()
    for _ in range(samples):
        sampler.sample()
    return sampler.end(baseline_used=int(0.6 * GIB), steps=steps, samples=steps * batch)


def test_peak_baseline_and_energy():
    used = [int(x * GIB) for x in (0.6, 20, 31.5, 30, 31, 29, 31.2, 30.5, 31.4, 30, 31, 30, 31.5, 30)]
    fake = FakeNvml(used=used, energy=[1_000_000, 1_450_000], processes=[(4242, int(30 * GIB))])
    out = run_window(fake, clock_step=0.2)  # a 2.6 s window
    assert out["nvml_mem_used_peak_bytes"] == int(31.5 * GIB)
    assert out["nvml_mem_used_delta_bytes"] == int(31.5 * GIB) - int(0.6 * GIB)
    assert out["nvml_mem_v2_reserved_bytes"] == 512 * 2**20
    assert out["nvml_process_mem_peak_bytes"] == int(30 * GIB)
    assert out["energy_j"] == pytest.approx(450.0)
    assert out["energy_j_per_step"] == pytest.approx(450 / 20)
    assert out["samples_per_joule"] == pytest.approx(20 * 64 / 450)
    assert out["power_limit_w"] == 700.0 and out["power_avg_w"] == pytest.approx(450 / 2.6)
    assert out["sm_clock_mhz_median"] == 1980 and out["temperature_c_max"] == 45
    assert out["clock_event_reasons"] == "none"
    assert out["nvml_notes"] == ""


def test_energy_counter_wrap():
    fake = FakeNvml(used=[GIB], energy=[ENERGY_WRAP - 100_000, 250_000])
    assert run_window(fake)["energy_j"] == pytest.approx(350.0)


def test_clock_event_reasons_are_decoded_and_accumulated():
    fake = FakeNvml(used=[GIB], events=[0x0, 0x4, 0x4 | 0x40, 0x0])
    assert run_window(fake)["clock_event_reasons"] == "sw_power_cap|hw_thermal_slowdown"
    assert decode_clock_events(0x8 | 0x1000) == ["hw_slowdown", "unknown_0x1000"]


def test_older_driver_falls_back_to_throttle_reasons():
    fake = FakeNvml(used=[GIB], events=[0x8], unsupported={"nvmlDeviceGetCurrentClocksEventReasons"})
    out = run_window(fake)
    assert out["clock_event_reasons"] == "hw_slowdown"
    assert fake.calls.count("nvmlDeviceGetCurrentClocksEventReasons") == 1  # not retried every sample
    assert "clock_events" not in out["nvml_notes"]


def test_unsupported_calls_degrade_to_empty_values_with_reasons():
    fake = FakeNvml(used=[GIB], unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetMemoryInfo_v2",
                                             "nvmlDeviceGetCurrentClocksEventReasons",
                                             "nvmlDeviceGetCurrentClocksThrottleReasons"})
    out = run_window(fake)
    assert out["energy_j"] is None and out["samples_per_joule"] is None and out["power_avg_w"] is None
    assert out["nvml_mem_v2_reserved_bytes"] is None and out["clock_event_reasons"] is None
    assert "energy: NotSupported: Not Supported" in out["nvml_notes"]
    assert "memory_v2: NotSupported" in out["nvml_notes"] and "throttle_reasons: NotSupported" in out["nvml_notes"]
    assert out["nvml_mem_used_peak_bytes"] == GIB  # what is supported still reports
    assert fake.calls.count("nvmlDeviceGetTotalEnergyConsumption") == 1


def test_process_memory_not_visible_is_said_not_reported_as_zero():
    fake = FakeNvml(used=[GIB], processes=[(1, 5 * GIB)])  # host PIDs only: ours is not there
    out = run_window(fake, pid=4242)
    assert out["nvml_process_mem_peak_bytes"] is None
    assert "not in NVML's process list" in out["nvml_notes"]


def test_sampler_thread_samples_at_its_interval_and_stops():
    fake = FakeNvml(used=[GIB, 2 * GIB], energy=[0, 1000])
    sampler = NvmlSampler(NvmlReader(fake, "h"), interval_s=0.01)
    sampler.start()
    time.sleep(0.3)
    out = sampler.stop(baseline_used=GIB, steps=1, samples=1)
    assert 10 <= out["nvml_samples"] <= 40
    assert not [t for t in threading.enumerate() if t.name == "amp_bench-nvml"]
    assert "energy_window" in out["nvml_notes"]  # 0.3 s is too short for a trustworthy energy figure


def test_handle_by_uuid_then_pci_then_index():
    fake = FakeNvml(used=[GIB])
    assert device_handle(fake, "8f2b-uuid", 0) == ("handle-GPU-8f2b-uuid", "")
    fake.unsupported.add("nvmlDeviceGetHandleByUUID")
    fake.nvmlDeviceGetHandleByPciBusId = lambda bus: f"handle-pci-{bus}"
    assert device_handle(fake, "8f2b-uuid", 3, "00000000:65:00.0") == ("handle-pci-00000000:65:00.0", "")
    del fake.nvmlDeviceGetHandleByPciBusId  # an nvidia-ml-py without it, or no match
    handle, note = device_handle(fake, "8f2b-uuid", 3, "00000000:65:00.0")
    assert handle == "handle-3" and "by index" in note
    # with CUDA_VISIBLE_DEVICES remapping, the index could name another GPU: refuse, don't guess
    with pytest.raises(RuntimeError, match="cannot match CUDA device 1"):
        device_handle(fake, "8f2b-uuid", 1, None, "3,5")


def test_zero_energy_is_unknown_not_zero():
    out = run_window(FakeNvml(used=[GIB], energy=[5000, 5000]), clock_step=0.2)
    assert out["energy_j"] is None and out["power_avg_w"] is None and out["energy_j_per_step"] is None
    assert "did not advance" in out["nvml_notes"]


def test_no_nvml_library_is_a_one_line_reason():
    try:
        import pynvml
        pynvml.nvmlInit()
        pytest.skip("NVML works on this machine")
    except Exception:
        pass
    with pytest.raises(RuntimeError, match="NVML unavailable|not installed") as info:
        load_nvml()
    assert "\n" not in str(info.value)


def test_clock_event_reasons_come_from_in_window_samples_only():
    """The window's edges are read with the GPU idle (before the first step is launched, after the
    last has synchronised): their gpu_idle bit must not land in every row."""
    fake = FakeNvml(used=[GIB], energy=[0, 1000])
    busy = [False]
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x0 if busy[0] else 0x1  # idle outside the window
    sampler = NvmlSampler(NvmlReader(fake, "h"), interval_s=0.01, slow_interval_s=0.0, process_interval_s=0.0,
                          clock=Clock(0.05))
    sampler.begin()
    busy[0] = True
    for _ in range(3):
        sampler.sample()
    busy[0] = False
    out = sampler.end(baseline_used=GIB, steps=3, samples=3)
    assert out["clock_event_reasons"] == "none"
    # and a window too short for any in-window reading says so rather than reporting the idle edges
    short = NvmlSampler(NvmlReader(FakeNvml(used=[GIB], events=[0x1]), "h"), slow_interval_s=0.0, clock=Clock())
    short.begin()
    out = short.end(baseline_used=GIB, steps=1, samples=1)
    assert out["clock_event_reasons"] is None and "no reading inside the window" in out["nvml_notes"]
    assert out["nvml_mem_used_peak_bytes"] == GIB  # memory is still read at the edges


def test_the_sampler_stops_before_the_windows_closing_synchronisation():
    """measure_window halts the sampler after the last step is launched and before the final
    synchronise: while the queue drains and the GPU then idles, a late sample would add gpu_idle."""
    from amp_bench.measure.window import StopRule, measure_window
    fake = FakeNvml(used=[GIB], energy=[0, 1000])
    idle = [False]
    fake.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: 0x1 if idle[0] else 0x0
    sampler = NvmlSampler(NvmlReader(fake, "h"), interval_s=0.002, slow_interval_s=0.0, process_interval_s=0.0)

    class Timer:  # a CUDA-like timer: the closing synchronise waits while the GPU has gone idle
        cheap_times = False

        def begin_window(self):
            pass

        def step_started(self):
            pass

        def step_ended(self):
            pass

        def end_window(self):
            idle[0] = True
            time.sleep(0.3)  # 150 sampling intervals: a running sampler reads gpu_idle here
            return [1.0, 1.0], 0.2

    sampler.start()
    measure_window(lambda: time.sleep(0.02), Timer(), StopRule.fixed(2), before_end=sampler.halt)
    out = sampler.stop(GIB, steps=2, samples=2)
    assert "gpu_idle" not in str(out["clock_event_reasons"]), out["clock_event_reasons"]
    # without the halt the same window reports gpu_idle: the test can fail
    idle[0] = False
    late = NvmlSampler(NvmlReader(fake, "h"), interval_s=0.002, slow_interval_s=0.0, process_interval_s=0.0)
    late.start()
    measure_window(lambda: time.sleep(0.02), Timer(), StopRule.fixed(2))
    assert "gpu_idle" in late.stop(GIB, steps=2, samples=2)["clock_event_reasons"]
