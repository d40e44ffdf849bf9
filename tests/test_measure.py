"""What run_case does around the window on a GPU, through fakes on the CPU: the idle NVML baseline
taken at one point for every mode (after DDP's process group and the same library warm-up), and
the settle step between warmup and the window (cudnn.benchmark's cached workspaces dropped)."""
import ast
import inspect

import pytest

from amp_bench.measure import case as measure
from amp_bench.measure.devices.cpu import CpuOps
from amp_bench.measure.devices.cuda import CudaOps
from amp_bench.measure.precision import Fp32MathError, set_fp32_math
from amp_bench.modes import get as get_mode
from amp_bench.platform.device import DeviceInfo
from amp_bench.suite import Case, ModelSpec, OptimizerSpec
from conftest import ROOT


class FakeCuda:
    """Stands in for torch.cuda; logs every call into the shared `calls` list."""

    def __init__(self, calls):
        self.calls = calls

    def synchronize(self, device=None):
        self.calls.append("synchronize")

    def empty_cache(self):
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self, device=None):
        self.calls.append("reset_peak_memory_stats")

    def memory_stats(self, device=None):
        return {"num_alloc_retries": 0}


class FakeReader:
    def __init__(self, calls, used=7 * 2**30):
        self.calls, self.used = calls, used

    def memory_used(self):
        self.calls.append("nvml_used")
        return self.used


class FakeStep:
    def __init__(self, calls):
        self.calls = calls

    def untimed_step(self, inputs, target):
        self.calls.append("untimed_step")


def _case(precision="fp32", **kw):
    return Case(suite="s", model=ModelSpec(ref="python:toy_models:mlp", label="mlp"), batch_size=4,
                precision=precision, channels_last=False, image_size=None, seq_len=None, warmup_steps=2, steps=3,
                repeats=1, optimizer=OptimizerSpec(), seed=0, timeout_s=60, allow_emulated=True,
                search_dirs=(str(ROOT / "tests" / "fixtures"),), **kw)


@pytest.fixture(autouse=True)
def strict_flags():
    set_fp32_math("ieee")
    yield
    set_fp32_math("ieee")


def test_settle_drops_the_autotuning_cache_then_steps_then_resets_peaks_then_reads_nvml():
    calls, record = [], {}
    measure._settle_after_warmup(_case(), get_mode("fp32"), FakeStep(calls), None, None,
                                 CudaOps("cuda:0", cuda=FakeCuda(calls)), FakeReader(calls), record, 1)
    assert calls == ["synchronize", "empty_cache", "untimed_step", "synchronize", "reset_peak_memory_stats",
                     "nvml_used"]
    assert record == {"settle_steps": 1, "nvml_mem_used_settled_bytes": 7 * 2**30}


def test_settle_on_the_cpu_takes_no_extra_step_but_rechecks_the_fp32_math():
    import torch
    calls = []
    measure._settle_after_warmup(_case(), get_mode("fp32"), FakeStep(calls), None, None, CpuOps("cpu"), None, {}, 1)
    assert calls == []  # no allocator tuned for a kept-memory case: no settle step
    torch.backends.cudnn.allow_tf32 = True  # as if building the model had turned cuDNN's TF32 back on
    with pytest.raises(Fp32MathError, match="fp32 needs strict IEEE FP32 outside autocast, but cuDNN"):
        measure._settle_after_warmup(_case(), get_mode("fp32"), FakeStep(calls), None, None, CpuOps("cpu"), None, {}, 1)


class FakeRank:
    def __init__(self, calls):
        self.calls = calls

    def barrier(self):
        self.calls.append("barrier")


@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp_fp16", "amp_bf16"])
def test_nvml_baseline_is_read_after_the_process_group_and_the_same_library_warmup(precision):
    """The same sequence whatever the mode: the AMP modes' autocast proof must not be what decides
    whether cuBLAS's workspace is inside the baseline or the training memory."""
    calls = []
    ops = CudaOps("cuda:0", cuda=FakeCuda(calls), warm=lambda device: calls.append("warm_libraries"))
    used = ops.nvml_baseline(FakeReader(calls), FakeRank(calls))
    assert used == 7 * 2**30
    assert calls == ["barrier", "warm_libraries", "synchronize", "empty_cache", "nvml_used"]
    assert "precision" not in inspect.signature(CudaOps.nvml_baseline).parameters
    # without NVML the warm-up (and the collective) still happen on every rank alike
    calls.clear()
    assert ops.nvml_baseline(None, FakeRank(calls)) is None
    assert calls == ["barrier", "warm_libraries", "synchronize", "empty_cache"]


def _call_lines(function, names):
    """Line of the first call to each dotted name inside `function`'s source."""
    tree = ast.parse(inspect.getsource(function))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in names and name not in found:
                found[name] = node.lineno
    return found


def test_run_case_hooks_in_at_the_right_points():
    """DDP: the baseline after init_process_group; the settle after warmup and before the window."""
    lines = _call_lines(measure._set_up, {"rank.init", "ops.open_telemetry", "build_step", "prepare_case"})
    assert lines["prepare_case"] < lines["rank.init"] < lines["ops.open_telemetry"] < lines["build_step"]
    order = _call_lines(measure.run_case, {"_set_up", "_warm_up", "_window", "_instrument"})
    assert order["_set_up"] < order["_warm_up"] < order["_window"] < order["_instrument"]
    warm = _call_lines(measure._warm_up, {"compiling.warm_up", "_settle_after_warmup"})
    assert warm["compiling.warm_up"] < warm["_settle_after_warmup"]
    assert "measure_window" in _call_lines(measure._window, {"measure_window"})


def test_run_case_on_the_cpu_settles_between_warmup_and_window_and_records_the_scaler_sync(monkeypatch):
    events = []

    class Events:
        def emit(self, **event):
            events.append((event.get("phase"), event.get("event")))

    seen = []
    real = measure._settle_after_warmup
    monkeypatch.setattr(measure, "_settle_after_warmup", lambda *a, **k: seen.append(list(events)) or real(*a, **k))
    from amp_bench.platform.device import precision_support
    cpu = DeviceInfo("cpu", "cpu")
    record = measure.run_case(_case("amp_bf16"), cpu, Events(), support=precision_support("amp_bf16", cpu))
    assert record["status"] == "ok" and record["scaler_host_sync"] is False
    assert len(seen) == 1
    before = seen[0]
    assert sum(1 for phase, kind in before if (phase, kind) == ("warmup", "step")) == 2  # all warmup steps ran
    assert ("measure", "phase") not in before  # and the window had not opened


def test_a_kept_memory_cpu_case_settles_one_untimed_step_outside_the_samples_and_the_losses():
    """warmup_steps 1: the second step, whose memory still faults in, is taken untimed; the row's samples
    and losses are warmup's one step and the window's three, numbered as before."""
    from amp_bench.platform.device import precision_support

    class Events:
        def emit(self, **event):
            pass

    cpu = DeviceInfo("cpu", "cpu")
    from dataclasses import replace
    case = replace(_case("fp32"), warmup_steps=1)
    record = measure.run_case(case, cpu, Events(), support=precision_support("fp32", cpu))
    assert record["status"] == "ok" and record["cpu_allocator"] in ("keep", "system (not glibc)")
    assert record["settle_steps"] == 1 and record["settle_faulted_bytes"] >= 0
    assert record["window_faulted_bytes_per_step"] >= 0
    assert [(s["phase"], s["step"]) for s in record["samples"]] == [("warmup", 0), ("measure", 1), ("measure", 2),
                                                                     ("measure", 3)]
    assert record["steps"] == 3 and all(s["loss"] is not None for s in record["samples"])


def test_the_trackers_stop_in_order_and_say_their_warnings_beside_their_columns():
    """A tracker that reads another's columns (contention reads NVML's clock events) names it and stops
    after it, or the window refuses to run; a tracker's warning comes back beside the columns, never as
    one of them; the window's step count is its step times'."""
    from amp_bench.measure.trackers import ContentionTracker, Tracker, run_window
    from amp_bench.measure.window import WindowTimes

    class Clocks(Tracker):
        columns = {"clock_event_reasons": "hw_slowdown"}

        def stop(self, steps):
            return {"steps_seen": steps, **self.columns}

    class Warns(Tracker):
        def stop(self, steps):
            self.warnings = ("3 recompiles inside the window",)
            return {"recompiles_in_window": 3}

    class Watch:
        def start(self):
            pass

        def stop(self):
            return {"contended": False}

    class Sampler:
        reader = type("Reader", (), {"other_processes": lambda self: []})()

    clocks = Clocks()
    clocks.sampler = Sampler()
    contention = ContentionTracker(Watch(), clocks)
    times = WindowTimes([1.0, 2.0, 3.0], 0.006, "fixed steps")
    reading = run_window([clocks, Warns(), contention], lambda halt: times)
    assert reading.times is times and reading.columns["steps_seen"] == 3
    assert reading.warnings == ["3 recompiles inside the window"] and "_warning" not in reading.columns
    assert "contended" in reading.columns  # read with the clock events the tracker before it gave
    with pytest.raises(AssertionError, match="stops before one it reads"):
        run_window([contention, clocks], lambda halt: times)


def _window_record(losses, warnings=()):
    from amp_bench.measure.window import StopRule, WindowTimes
    from amp_bench.stats import Window
    times = WindowTimes([100.0, 102.0, 98.0], 0.31, "fixed steps")
    window = Window.from_steps(times.per_step_ms, 8, seconds=0.31)
    return measure.WindowRecord(times, StopRule(3, 3, None, None), window, losses, 2, "bfloat16",
                                {"peak_rss_bytes": 1}, {}, list(warnings))


def test_a_window_record_is_the_rows_window_part_with_its_status_and_samples():
    """The worker's row takes its window part from one typed record: the figures, the warnings joined once, the
    status from the losses (nonfinite at the first NaN, the timings kept), the samples warmup's first."""
    columns = _window_record([2.0, 1.9, 1.8, float("nan"), 1.7], ["tracker said so"]).columns()
    assert (columns["status"], columns["steps"], columns["stop_reason"]) == ("nonfinite", 3, "fixed steps")
    assert columns["reason"] == "loss is nan at step 3 (1 non-finite of 5)"
    assert columns["step_time_ms_median"] == 100.0 and columns["peak_rss_bytes"] == 1
    assert columns["warnings"] == "tracker said so" and columns["loss_first"] == 2.0
    assert [(s["phase"], s["step_time_ms"]) for s in columns["samples"]] == [
        ("warmup", None), ("warmup", None), ("measure", 100.0), ("measure", 102.0), ("measure", 98.0)]
    assert _window_record([1.0] * 5).columns()["status"] == "ok"


def test_a_probe_that_fails_after_the_window_is_the_windows_warning_not_its_loss(monkeypatch):
    from types import SimpleNamespace

    def broken(setup, median_ms):
        raise RuntimeError("counter broke")
    monkeypatch.setattr(measure, "AFTER_WINDOW", (lambda setup, median_ms: {"flops_per_step": 5}, broken))
    setup = SimpleNamespace(case=SimpleNamespace(instrument=True, count_flops=True), record={})
    window = _window_record([1.0] * 5, ["unstable"])
    measure._instrument(setup, window)
    row = {**setup.record, **window.columns()}
    assert row["flops_per_step"] == 5 and row["status"] == "ok"
    assert row["warnings"] == "unstable | FLOP/phase instrumentation failed: RuntimeError: counter broke"
