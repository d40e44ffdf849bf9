"""Numbers you can trust on any machine: the adaptive window, contention, one emulation rule and the
headline. Speed differences are injected (a fake clock, scripted /proc readings), never hoped for."""
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from amp_bench.analysis.headline import headlines
from amp_bench.measure.telemetry.contention import (
    HostTimes,
    cpu_contention,
    gpu_contention,
    read_host_times,
    resolvable_s,
)
from amp_bench.measure.window import CpuStepTimer, StopRule, measure_window
from amp_bench.platform.device import DeviceInfo, effective_cpu_flags, may_run, precision_support, probe_device
from amp_bench.stats import median_ci, relative_half_width

# --------------------------------------------------------------------------- the adaptive window

def test_median_interval_covers_the_median_at_least_95_percent():
    rng = np.random.default_rng(3)
    for n in (6, 20, 80):
        hits = sum(lo <= 1.0 <= hi for lo, hi in (median_ci(rng.lognormal(0, 0.3, n)) for _ in range(1000)))
        assert hits >= 930, (n, hits)  # >= 95% less Monte-Carlo slack
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for an interval: the range


def test_stop_rule_reasons():
    quiet = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
    noisy = [10.0, 14.0, 7.0, 12.0, 8.0, 15.0, 6.0, 11.0]
    assert StopRule.fixed(8).reason_to_stop(quiet, 0) == "fixed steps"
    assert StopRule.fixed(8).reason_to_stop(quiet[:5], 0) is None
    rule = StopRule(min_steps=6, max_steps=100, target_ci=0.01, budget_s=5.0)
    assert rule.reason_to_stop(quiet[:5], 0) is None  # under min_steps, however precise
    assert rule.reason_to_stop(quiet, 0.1) == "precision reached"
    assert rule.reason_to_stop(noisy, 0.1) is None
    assert rule.reason_to_stop(noisy, 5.0) == "budget"
    assert rule.reason_to_stop(noisy * 13, 0.1) == "max steps"
    assert relative_half_width(noisy) > 0.01 > relative_half_width(quiet)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def run_window(step_ms, rule):
    clock = FakeClock()
    times = iter(step_ms)

    def step():
        clock.now += next(times) / 1e3
    return measure_window(step, CpuStepTimer(clock), rule)


def test_window_stops_when_precise_or_at_the_budget():
    steady = [20.0 + 0.01 * (i % 3) for i in range(500)]
    per_step, window_s, reason = run_window(steady, StopRule(10, 400, target_ci=0.01))
    assert reason == "precision reached" and len(per_step) == 10 and window_s == pytest.approx(sum(per_step) / 1e3)
    jumpy = list(np.random.default_rng(0).uniform(10, 30, 500))
    per_step, _, reason = run_window(jumpy, StopRule(5, 400, target_ci=0.001, budget_s=1.0))
    assert reason == "budget" and 1.0 <= sum(per_step) / 1e3 < 1.0 + 0.031
    per_step, _, reason = run_window(jumpy, StopRule(5, 30, target_ci=0.001))
    assert reason == "max steps" and len(per_step) == 30
    per_step, _, reason = run_window(jumpy, StopRule.fixed(7))
    assert reason == "fixed steps" and len(per_step) == 7


# --------------------------------------------------------------------------- contention

QUIET = HostTimes(busy_s=1000.0, steal_s=1.0, own_cpu_s=50.0, cpus=2)


def after(seconds, own, others, steal=0.0):
    return HostTimes(QUIET.busy_s + own + others, QUIET.steal_s + steal, QUIET.own_cpu_s + own, 2)


def test_contention_from_host_readings():
    quiet = cpu_contention(QUIET, after(10, own=19.5, others=0.2), 10.0, threads=2)
    assert quiet["contended"] is False and quiet["cpu_share_available"] > 0.85
    neighbour = cpu_contention(QUIET, after(10, own=13.0, others=10.0), 10.0, threads=2)
    assert neighbour["contended"] is True and neighbour["cpu_share_available"] == pytest.approx(0.5)
    assert "other processes used 1.00 of 2 cores" in neighbour["contention"]
    # one busy core beside a one-thread worker: it still had a whole core
    assert cpu_contention(QUIET, after(10, own=9.9, others=10.0), 10.0, threads=1)["contended"] is False
    stolen = cpu_contention(QUIET, after(10, own=19.0, others=0.0, steal=2.0), 10.0, threads=2)
    assert stolen["contended"] is True and "stole 10%" in stolen["contention"]
    assert cpu_contention(None, None, 1.0, threads=2)["contended"] is None  # unknown is not "quiet"


# /proc/stat as read on a quiet 2-core host (USER_HZ 100): 1 tick = 0.01 s of CPU time
TICK = 0.01


def test_a_window_shorter_than_proc_stat_can_resolve_is_unknown_not_contended():
    """8 ms of a 2-thread worker on a quiet 2-core host, and one tick of someone else's time (the
    parent's progress print): 1.25 cores 'used by others' is the tick, not a neighbour."""
    from amp_bench.store.results import contended
    short = cpu_contention(QUIET, after(0.008, own=0.016, others=TICK), 0.008, threads=2, ticks_per_s=100)
    assert short["host_other_cpu_cores"] == pytest.approx(1.25)  # what the old rule flagged
    assert short["contended"] is None
    assert short["contention"] == "unknown (window 8 ms is shorter than /proc/stat can resolve: needs 0.40 s)"
    assert not contended(pd.DataFrame([short])).any()  # unknown is not contended: comparable
    # the resolution follows the tolerance: one thread on two cores may lose 1.15 cores, so 0.10 s will do
    assert resolvable_s(2, 1, ticks_per_s=100) == pytest.approx(6 * 2 / (100 * 1.15))
    assert resolvable_s(2, 2, ticks_per_s=100) == pytest.approx(0.40)
    # a busy neighbour over a window long enough: flagged, as before
    busy = cpu_contention(QUIET, after(1.0, own=1.0, others=1.0), 1.0, threads=2, ticks_per_s=100)
    assert busy["contended"] is True and "other processes used 1.00 of 2 cores during the window" in busy["contention"]
    one_thread = cpu_contention(QUIET, after(1.0, own=0.5, others=1.5), 1.0, threads=1, ticks_per_s=100)
    assert one_thread["contended"] is True and one_thread["cpu_share_available"] == pytest.approx(0.5)
    # just past the resolution the one tick no longer looks like a neighbour
    quiet = cpu_contention(QUIET, after(0.4, own=0.8, others=TICK), 0.4, threads=2, ticks_per_s=100)
    assert quiet["contended"] is False and quiet["contention"] == ""


def replay(readings, clock):
    """A reader that returns recorded HostTimes and moves the fake clock to each reading's time."""
    it = iter(readings)

    def read():
        at, times = next(it)
        clock.now = at
        return times
    return read


def watch(readings, threads=2, warmup=True):
    from amp_bench.measure.telemetry.contention import WindowWatch
    clock = FakeClock()
    w = WindowWatch(threads, loadavg_path="/nonexistent", clock=clock, read=replay(readings, clock), ticks_per_s=100)
    if warmup:
        w.mark_warmup()
    w.start()
    return w.stop()


def test_a_short_window_is_judged_with_its_warmup():
    """Warmup 0.6 s + a window of 10 ms: the window alone can't be judged, warmup + window can."""
    # a neighbour on one core throughout: 0.61 s of its time; the worker's 2 threads the rest
    busy = watch([(0.0, QUIET), (0.6, after(0.6, own=0.6, others=0.6)), (0.61, after(0.61, own=0.61, others=0.61))])
    assert busy["contended"] is True and busy["host_other_cpu_cores"] == pytest.approx(1.0)
    assert "other processes used 1.00 of 2 cores during warmup + window (0.61 s)" in busy["contention"]
    quiet = watch([(0.0, QUIET), (0.6, after(0.6, own=1.2, others=TICK)), (0.61, after(0.61, own=1.22, others=TICK))])
    assert quiet["contended"] is False and quiet["contention"] == ""
    # too short even with its warmup: unknown, with both spans' real lengths
    short = watch([(0.0, QUIET), (0.05, after(0.05, own=0.1, others=0)), (0.058, after(0.058, own=0.1, others=TICK))])
    assert short["contended"] is None
    assert short["contention"] == ("unknown (window 8 ms is shorter than /proc/stat can resolve: needs 0.40 s; "
                                   "warmup + window 58 ms too)")
    # a compiled case takes no warmup reading (inductor's workers are other processes): unknown
    compiled = watch([(0.6, after(0.6, own=0.6, others=0.6)), (0.61, after(0.61, own=0.61, others=0.61))],
                     warmup=False)
    assert compiled["contended"] is None and compiled["contention"].startswith("unknown (window 10 ms")
    # a window long enough on its own is judged alone, whatever its warmup saw
    alone = watch([(0.0, QUIET), (0.5, after(0.5, own=0.0, others=1.0)), (1.5, after(1.5, own=2.0, others=1.0))])
    assert alone["contended"] is False and alone["host_other_cpu_cores"] == pytest.approx(0.0)


def test_unknown_contention_is_neither_contended_nor_hidden(tmp_path):
    """A row whose contention is unknown is comparable: a point of its series, no contended mark in
    the summary or the headline; a contended repeat's reason wins over another's unknown."""
    from amp_bench.analysis.gate.history import run_series
    from amp_bench.analysis.speedups import summarize
    from amp_bench.store.results import RunStore, contended, load_results
    unknown = {"contended": None, "contention": "unknown (window 8 ms is shorter than /proc/stat can resolve: "
                                                "needs 0.40 s)"}
    store = RunStore(tmp_path, "run")
    for precision, ms in (("fp32", 10.0), ("amp_bf16", 6.0)):
        for repeat in range(2):
            busy = {"contended": True, "contention": "another process"} if (precision, repeat) == ("amp_bf16", 1) \
                else unknown
            store.add({"run_id": "run", "suite": "s", "case_id": f"m-bs8-{precision}", "model_label": "m",
                       "batch_size": 8, "precision": precision, "channels_last": False, "image_size": 224,
                       "device": "cpu", "device_name": "AMD EPYC", "repeat": repeat, "status": "ok", "reason": "",
                       "step_time_ms_median": ms, "throughput": 800 / ms, "peak_rss_bytes": 1e9,
                       "timestamp": "2026-12-01T00:00:00+00:00", **busy}, [])
    rows = load_results(tmp_path)
    assert list(contended(rows)) == [False, False, False, True]
    assert len(run_series(rows)) == 2  # the unknown rows are points
    summary = summarize(rows).set_index("precision")
    assert summary.loc["fp32", "contended"] is not True and not summary.loc["fp32", "contended_vs_fp32"]
    assert summary.loc["amp_bf16", "contention"] == "another process"
    assert summary.loc["fp32", "contention"].startswith("unknown")
    quiet = headlines(summarize(rows[rows["repeat"] == 0]))  # every row unknown
    assert len(quiet) == 1 and "bf16 autocast is 1.67x faster" in quiet[0] and "CONTENDED" not in quiet[0]
    assert "CONTENDED" in headlines(summarize(rows))[0]  # the one contended repeat still shows


def test_read_host_times_from_a_proc_stat_file(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  205362 10 25113 44600 396 5 97 372 0 0\ncpu0 1 0 0 0 0 0 0 0 0 0\n"
                    "cpu1 1 0 0 0 0 0 0 0 0 0\nintr 1\n")
    times = read_host_times(str(stat), own_cpu_s=1.5)
    tick = os.sysconf("SC_CLK_TCK")
    assert times.cpus == 2 and times.busy_s == pytest.approx((205362 + 10 + 25113 + 5 + 97) / tick)
    assert times.steal_s == pytest.approx(372 / tick)
    assert read_host_times(str(tmp_path / "missing")) is None


def test_gpu_contention():
    assert gpu_contention([], "sw_power_cap")["contended"] is False
    busy = gpu_contention([4242], "")
    assert busy["contended"] and "1 other process" in busy["contention"]
    hot = gpu_contention([], "sw_thermal_slowdown, hw_slowdown")
    assert hot["contended"] and "hw_slowdown" in hot["contention"]
    # merged with the CPU side: a short (unknown) CPU window beside a quiet GPU stays unknown
    from amp_bench.measure.telemetry.contention import merge
    short = cpu_contention(QUIET, after(0.008, own=0.016, others=TICK), 0.008, threads=2, ticks_per_s=100)
    unknown = merge(short, gpu_contention([], ""))
    assert unknown["contended"] is None and unknown["contention"].startswith("unknown (window 8 ms")
    assert merge(short, busy)["contended"] is True and merge(short, busy)["contention"] == busy["contention"]
    quiet = cpu_contention(QUIET, after(10, own=19.5, others=0.2), 10.0, threads=2)
    assert merge(quiet, gpu_contention([], ""))["contended"] is False


# --------------------------------------------------------------------------- one emulation rule

ZEN2 = DeviceInfo("cpu", "AMD EPYC 7B12", cpu_flags=frozenset({"avx2", "fma"}), cpu_fp16_autocast=True)
ZEN4 = DeviceInfo("cpu", "AMD EPYC 9B14", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16"}),
                  cpu_fp16_autocast=True)
V100 = DeviceInfo("cuda", "Tesla V100-SXM2-32GB", index=0, capability=(7, 0))


@pytest.mark.parametrize("mode, device", [("amp_bf16", ZEN2), ("amp_fp16", ZEN2), ("amp_fp16", ZEN4),
                                          ("amp_bf16", V100)])
def test_every_emulated_mode_follows_one_rule(mode, device):
    support = precision_support(mode, device)
    assert not support.supported and support.emulated and "emulated" in support.reason
    assert may_run(support, allow_emulated=True) and not may_run(support, allow_emulated=False)


def test_native_modes_run_and_are_not_emulated():
    assert precision_support("amp_bf16", ZEN4).supported and not precision_support("amp_bf16", ZEN4).emulated


def test_onednn_isa_cap_hides_the_bf16_instructions(monkeypatch):
    flags = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    assert effective_cpu_flags(flags, "AVX2") == {"avx2", "avx512f"}
    assert effective_cpu_flags(flags, "AVX512_CORE_BF16") == {"avx2", "avx512f", "avx512_bf16"}
    assert effective_cpu_flags(flags, "") == flags
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    device = probe_device("cpu", cpu_info=("AMD EPYC", flags), cpu_fp16_autocast=True)
    assert precision_support("amp_bf16", device).emulated


# --------------------------------------------------------------------------- the headline

def summary_row(precision, **values):
    row = {"run_id": "r", "model_label": "resnet50", "batch_size": 8, "image_size": 224, "seq_len": np.nan,
           "channels_last": False, "device": "cpu", "device_name": "AMD EPYC", "world_size": 1,
           "precision": precision, "status": "ok", "reason": "", "emulated": False, "emulated_reason": "",
           "contended_vs_fp32": False}
    row.update(values)
    return row


def test_headline_sentences():
    fast = pd.DataFrame([summary_row("fp32"), summary_row("amp_bf16", speedup_vs_fp32=1.75, speedup_vs_fp32_ci_low=1.7,
                                                          speedup_vs_fp32_ci_high=1.81, mem_saving_vs_fp32=0.21)])
    assert headlines(fast) == ["resnet50 bs 8 224px on AMD EPYC: bf16 autocast is 1.75x faster than fp32 "
                               "(95% CI 1.70-1.81x), 21% less peak RSS."]
    slow = pd.DataFrame([summary_row("fp32"), summary_row(
        "amp_bf16", speedup_vs_fp32=0.09, speedup_vs_fp32_ci_low=0.085, speedup_vs_fp32_ci_high=0.095, emulated=True,
        emulated_reason="CPU has no AVX512-BF16/AMX-BF16: bf16 runs emulated", contended_vs_fp32=True)])
    text = headlines(slow)[0]
    assert "bf16 autocast is 11.11x slower than fp32 (95% CI 10.53-11.76x)" in text
    assert "(emulated: CPU has no AVX512-BF16/AMX-BF16)" in text and "CONTENDED" in text
    skipped = pd.DataFrame([summary_row("fp32"), summary_row(
        "amp_bf16", status="unsupported", emulated=True,
        reason="CPU has no AVX512-BF16/AMX-BF16: bf16 runs emulated (not run: allow_emulated ...)")])
    # the reason in short (its full text is said once, in the run's notes and the report's not-measured table)
    assert "bf16 autocast not run (CPU has no AVX512-BF16/AMX-BF16; allow_emulated: true measures it)" \
        in headlines(skipped)[0]


# --------------------------------------------------------------------------- for real

CPU_SUITE = """
models: [{{ref: "python:toy_models:{model}", label: m}}]
batch_sizes: [64]
precisions: [fp32]
warmup_steps: 3
target_ci: 0.0001
min_steps: 5
max_steps: 100000
case_budget_s: {budget}
repeats: 1
"""


def _burner() -> subprocess.Popen:
    # its own session, as a neighbour's job would be: Linux's autogroup scheduler shares the CPU out
    # per session first, so burners inside pytest's session would only compete with each other
    return subprocess.Popen([sys.executable, "-c",
                             "import time\nend = time.time() + 120\nwhile time.time() < end: pass"],
                            start_new_session=True)


@pytest.mark.slow
@pytest.mark.solo  # its quiet half needs no other test running beside it
def test_a_worker_beside_cpu_burners_is_flagged_and_a_quiet_one_is_not(write_suite, tmp_path, monkeypatch):
    """One-thread worker: beside burners on every core it is contended; alone, with one core free
    even if something else holds the other, other processes are never blamed (a VM's hypervisor may
    still steal enough to flag it, and the row then says so)."""
    from amp_bench.studies.benchmark import run_suite
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    suite = write_suite(CPU_SUITE.format(model="mlp", budget=3.0))
    quiet = run_suite(suite, device="cpu", results_dir=tmp_path / "quiet").iloc[0]
    assert quiet["status"] == "ok" and quiet["num_threads"] == 1
    if quiet["contended"] in (True, "True"):  # the hypervisor's steal is contention no test can prevent on a VM
        assert "hypervisor stole" in quiet["contention"]
        assert "other processes" not in quiet["contention"], quiet["contention"]
    burners = [_burner() for _ in range(2 * (os.cpu_count() or 2))]
    try:
        time.sleep(0.5)
        busy = run_suite(suite, device="cpu", results_dir=tmp_path / "busy").iloc[0]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert busy["status"] == "ok" and busy["contended"] in (True, "True"), busy.to_dict()
    assert busy["cpu_share_available"] < 0.85 and "other processes used" in busy["contention"]


@pytest.mark.slow
def test_adaptive_window_records_why_it_stopped_with_a_fake_clock(write_suite, tmp_path):
    from amp_bench.studies.benchmark import run_suite
    suite = write_suite(CPU_SUITE.format(model="clocked", budget=0.5).replace("target_ci: 0.0001", "target_ci: 0.01"))
    row = run_suite(suite, device="cpu", results_dir=tmp_path / "r").iloc[0]
    assert row["status"] == "ok" and row["stop_reason"] in ("precision reached", "budget")
    assert row["step_time_ms_ci_low"] <= row["step_time_ms_median"] <= row["step_time_ms_ci_high"]
    assert row["step_time_ms_median"] == pytest.approx(20.0, rel=0.03)  # the injected time, not the machine's
    assert row["steps"] >= 5


# --------------------------------------------------------------------------- suite keys and the budget

ADAPTIVE = "models: [torchvision/resnet18]\nbatch_sizes: [8]\nprecisions: [fp32]\n"


@pytest.mark.parametrize("text, expected", [
    ("min_steps: 10\nmax_steps: 5\n", "min_steps: 10 is more than max_steps: 5"),
    ("target_ci: 2\n", "target_ci:"),
    ("budget_s: -1\n", "budget_s:"),
])
def test_bad_window_keys_get_one_line_naming_file_and_field(write_suite, text, expected):
    from amp_bench.errors import SuiteError
    from amp_bench.suite import load_suite
    path = write_suite(ADAPTIVE + text)
    with pytest.raises(SuiteError) as info:
        load_suite(path).cases("cpu")
    assert len(info.value.lines) == 1 and str(path) in info.value.lines[0] and expected in info.value.lines[0]


def test_steps_override_switches_an_adaptive_window_off(write_suite):
    from amp_bench.suite import load_suite
    suite = load_suite(write_suite(ADAPTIVE + "target_ci: 0.02\nbudget_s: 60\n"))
    adaptive = suite.cases("cpu")[0]
    assert adaptive.target_ci == 0.02 and adaptive.budget_s == 60
    fixed = suite.cases("cpu", {"steps": 7})[0]
    assert fixed.steps == 7 and fixed.target_ci is None and fixed.budget_s is None
    both = suite.cases("cpu", {"steps": 7, "target_ci": 0.05})[0]  # asked for together: kept
    assert both.target_ci == 0.05


def test_budget_planner_shares_what_is_left_less_the_learnt_overhead(write_suite):
    from amp_bench.studies.run_plan import BudgetPlanner
    from amp_bench.suite import load_suite
    case = load_suite(write_suite(ADAPTIVE)).cases("cpu")[0]
    clock = FakeClock()
    planner = BudgetPlanner(100.0, 4, clock=clock)
    assert planner.plan(case).case_budget_s == pytest.approx(25.0)  # nothing learnt yet
    clock.now = 30.0
    planner.finished({"worker_seconds": 30.0, "window_s": 25.0})  # 5 s outside the window
    assert planner.plan(case).case_budget_s == pytest.approx(70.0 / 3 - 5.0, abs=1e-3)  # rounded to ms
    clock.now = 200.0  # overrun: the floor, never zero or negative
    assert planner.plan(case).case_budget_s == BudgetPlanner.FLOOR_S
    assert BudgetPlanner(None, 4).plan(case) is case
